// The layer tree: OCI whiteouts and opaque directories, later layers over earlier ones, hard
// links, and paths that must stay inside the image.
#include "import/layer_tree.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "import/enroot_image_files.h"
#include "util/errors.h"

namespace sqbox {
namespace {

LayerEntry file(const std::string& path, uint64_t size = 1) {
    LayerEntry entry;
    entry.path = path;
    entry.mode = S_IFREG | 0644;
    entry.size = size;
    return entry;
}

LayerEntry directory(const std::string& path) {
    LayerEntry entry;
    entry.path = path;
    entry.mode = S_IFDIR | 0755;
    return entry;
}

LayerEntry symlink(const std::string& path, const std::string& target) {
    LayerEntry entry;
    entry.path = path;
    entry.mode = S_IFLNK | 0777;
    entry.symlink = target;
    return entry;
}

const SquashfsEntry* find(const SquashfsEntry& root, const std::vector<std::string>& path) {
    const SquashfsEntry* current = &root;
    for (const std::string& name : path) {
        auto found = current->children.find(name);
        if (found == current->children.end()) return nullptr;
        current = found->second.get();
    }
    return current;
}

TEST(LayerTree, WhiteoutRemovesOnlyWhatLowerLayersHad) {
    LayerTree tree;
    tree.apply(file("etc/a"), 0, 0, "layer 1");
    tree.apply(file("etc/b"), 1, 0, "layer 2");
    tree.apply(file("etc/.wh.a"), 1, 1, "layer 2");
    tree.apply(file("etc/.wh.b"), 1, 2, "layer 2");  // same layer: b stays
    EXPECT_EQ(find(tree.root(), {"etc", "a"}), nullptr);
    EXPECT_NE(find(tree.root(), {"etc", "b"}), nullptr);
    EXPECT_EQ(find(tree.root(), {"etc", ".wh.a"}), nullptr);
}

TEST(LayerTree, OpaqueDirectoryHidesLowerContentsAtEveryDepth) {
    LayerTree tree;
    tree.apply(file("d/old"), 0, 0, "layer 1");
    tree.apply(file("d/sub/deep"), 0, 1, "layer 1");
    tree.apply(directory("d/sub"), 1, 0, "layer 2");
    tree.apply(file("d/sub/new"), 1, 1, "layer 2");
    tree.apply(file("d/.wh..wh..opq", 0), 1, 2, "layer 2");
    EXPECT_EQ(find(tree.root(), {"d", "old"}), nullptr);
    EXPECT_EQ(find(tree.root(), {"d", "sub", "deep"}), nullptr);
    EXPECT_NE(find(tree.root(), {"d", "sub", "new"}), nullptr);
}

TEST(LayerTree, LaterFileWinsAndOnlyItsDataIsPlanned) {
    LayerTree tree;
    tree.apply(file("f", 10), 0, 3, "layer 1");
    tree.apply(file("f", 20), 1, 7, "layer 2");
    auto plan = tree.data_plan(2);
    EXPECT_TRUE(plan[0].empty());
    ASSERT_EQ(plan[1].size(), 1u);
    EXPECT_EQ(plan[1][0]->data_entry, 7u);
    EXPECT_EQ(plan[1][0]->data_size, 20u);
}

TEST(LayerTree, HardLinksShareOneInodeAndSurviveTheirTargetsReplacement) {
    LayerTree tree;
    tree.apply(file("a", 5), 0, 0, "layer 1");
    LayerEntry link = file("b", 0);
    link.hardlink = "a";
    tree.apply(link, 0, 1, "layer 1");
    EXPECT_EQ(find(tree.root(), {"a"})->inode, find(tree.root(), {"b"})->inode);
    tree.apply(file("a", 9), 1, 0, "layer 2");
    EXPECT_NE(find(tree.root(), {"a"})->inode, find(tree.root(), {"b"})->inode);
    EXPECT_EQ(find(tree.root(), {"b"})->inode->data_size, 5u);
}

TEST(LayerTree, DotDotAndLinksToNothingAreRefused) {
    LayerTree tree;
    EXPECT_THROW(tree.apply(file("a/../../x"), 0, 0, "layer 1"), Error);
    LayerEntry link = file("b", 0);
    link.hardlink = "../etc/passwd";
    EXPECT_THROW(tree.apply(link, 0, 1, "layer 1"), Error);
    link.hardlink = "missing";
    EXPECT_THROW(tree.apply(link, 0, 2, "layer 1"), Error);
    tree.apply(file("plain"), 0, 3, "layer 1");
    EXPECT_THROW(tree.apply(file("plain/under"), 0, 4, "layer 1"), Error);
}

TEST(LayerTree, SymlinksOfEarlierLayersResolveInsideTheTree) {
    LayerTree tree;
    tree.apply(symlink("escape", "/../../host"), 0, 0, "layer 1");
    tree.apply(symlink("loop", "loop"), 0, 1, "layer 1");
    tree.apply(file("escape/file"), 1, 0, "layer 2");
    EXPECT_NE(find(tree.root(), {"host", "file"}), nullptr);
    EXPECT_THROW(tree.apply(file("loop/x"), 1, 1, "layer 2"), Error);
}

TEST(LayerTree, DevContentsAreLeftOutAsEnrootDoes) {
    LayerTree tree;
    tree.apply(directory("dev"), 0, 0, "layer 1");
    tree.apply(file("dev/null"), 0, 1, "layer 1");
    EXPECT_NE(find(tree.root(), {"dev"}), nullptr);
    EXPECT_EQ(find(tree.root(), {"dev", "null"}), nullptr);
}

TEST(EnrootImageFiles, RcEnvironmentAndFstabAsEnrootWritesThem) {
    nlohmann::json config = {{"config",
                              {{"Entrypoint", {"/bin/tini", "--"}},
                               {"Cmd", {"python", "it's"}},
                               {"Env", {"A=1", "B=two words"}},
                               {"WorkingDir", "/app"},
                               {"Volumes", {{"/data", nlohmann::json::object()}}},
                               {"Labels", {{"k", "multi\nline"}}}}}};
    EnrootImageFiles files = make_enroot_image_files(config, "docker://x");
    EXPECT_EQ(files.environment, "A=1\nB=two words\n");
    EXPECT_EQ(files.fstab, "${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n");
    EXPECT_EQ(files.working_directory, "/app");
    EXPECT_EQ(files.rc,
              "# enroot-provenance: docker://x\n"
              "# k multi line\n"
              "\n"
              "mkdir -p \"/app\" 2> /dev/null\n"
              "cd \"/app\" && unset OLDPWD || exit 1\n"
              "\n"
              "if [ -s /etc/rc.local ]; then\n"
              "    . /etc/rc.local\n"
              "fi\n"
              "\n"
              "if [ $# -gt 0 ]; then\n"
              "    exec '/bin/tini' '--' \"$@\"\n"
              "else\n"
              "    exec '/bin/tini' '--' 'python' 'it'\\''s'\n"
              "fi\n");
}

TEST(EnrootImageFiles, NoCommandRunsAShell) {
    EnrootImageFiles files = make_enroot_image_files(nlohmann::json::object(), "oci:x");
    EXPECT_NE(files.rc.find("    exec  \"$@\"\n"), std::string::npos);
    EXPECT_NE(files.rc.find("    exec  '/bin/sh'\n"), std::string::npos);
    EXPECT_EQ(files.working_directory, "/");
    EXPECT_EQ(bash_quote("a\tb"), "$'a\\tb'");
}

}  // namespace
}  // namespace sqbox
