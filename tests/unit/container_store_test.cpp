// The container store's promises when creates, starts and removes overlap: a held container is
// whole until let go of, its paths keep naming it, and what a remove (or a killed command) leaves
// is gone once nobody holds it.
#include "image/container_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "temp_directory.h"
#include "util/errors.h"

namespace sqbox {
namespace {

namespace fs = std::filesystem;

class ContainerStoreTest : public ::testing::Test {
  protected:
    ContainerStoreTest()
        : temp_("store"), data_(temp_.path() / "data"), image_(temp_.path() / "image.sqsh") {
        std::ofstream(image_) << "only its identity is recorded";
    }

    // Everything in DATA but the store's lock file, sorted.
    std::vector<std::string> entries() const {
        std::vector<std::string> names;
        for (const auto& entry : fs::directory_iterator(data_)) {
            const std::string name = entry.path().filename();
            if (name != ".sqbox-store.lock") names.push_back(name);
        }
        std::sort(names.begin(), names.end());
        return names;
    }

    static void write(const fs::path& path, const std::string& text) {
        std::ofstream(path) << text;
    }

    TempDirectory temp_;
    fs::path data_;
    fs::path image_;
};

TEST_F(ContainerStoreTest, ANameIsASymlinkToTheContainersOwnDirectory) {
    ContainerStore store(data_);
    store.create("box", image_, false);
    ASSERT_TRUE(fs::is_symlink(data_ / "box"));
    const fs::path directory = data_ / fs::read_symlink(data_ / "box");
    EXPECT_EQ(directory.filename().string().rfind(".sqbox-container-", 0), 0U);
    EXPECT_TRUE(fs::is_directory(directory / "upper"));
    EXPECT_TRUE(fs::is_directory(directory / "work"));
    EXPECT_EQ(store.names(), std::vector<std::string>{"box"});

    auto held = store.find("box");
    ASSERT_TRUE(held);
    EXPECT_EQ(fs::path(held->info().directory), directory);
    EXPECT_EQ(held->info().layer, held->info().directory);
    EXPECT_EQ(held->info().image, image_.string());
    held.reset();
    EXPECT_FALSE(store.find("elsewhere"));
}

TEST_F(ContainerStoreTest, ARefusedCreateLeavesNothingOfItsOwn) {
    ContainerStore store(data_);
    store.create("box", image_, false);
    const std::vector<std::string> before = entries();
    EXPECT_THROW(store.create("box", image_, false), Error);
    EXPECT_EQ(entries(), before);
    // Refused over any existing name, a plain file too: the file is kept, nothing else is left.
    write(data_ / "file", "not a container\n");
    EXPECT_THROW(store.create("file", image_, false), Error);
    std::vector<std::string> with_file = before;
    with_file.push_back("file");
    std::sort(with_file.begin(), with_file.end());
    EXPECT_EQ(entries(), with_file);
}

TEST_F(ContainerStoreTest, RemoveDeletesAContainerNobodyHolds) {
    ContainerStore store(data_);
    store.create("box", image_, false);
    store.remove("box");
    EXPECT_EQ(entries(), std::vector<std::string>{});
    EXPECT_THROW(store.remove("box"), Error);
}

TEST_F(ContainerStoreTest, AHeldContainerOutlivesItsRemoveAndItsReplacementUntilLetGo) {
    ContainerStore store(data_);
    store.create("box", image_, false);
    auto held = store.find("box");
    ASSERT_TRUE(held);
    const fs::path directory = held->info().directory;
    write(directory / "upper" / "state", "old");

    // A remove frees the name at once but leaves the directory to its holder...
    store.remove("box");
    EXPECT_FALSE(fs::exists(data_ / "box"));
    EXPECT_EQ(store.names(), std::vector<std::string>{});
    EXPECT_TRUE(fs::exists(directory / "upper" / "state"));
    EXPECT_FALSE(store.find("box"));

    // ...a new container takes the name, and is replaced in turn, without touching it...
    store.create("box", image_, false);
    store.create("box", image_, true);
    auto current = store.find("box");
    ASSERT_TRUE(current);
    EXPECT_NE(fs::path(current->info().directory), directory);
    EXPECT_FALSE(fs::exists(fs::path(current->info().directory) / "upper" / "state"));
    EXPECT_TRUE(fs::exists(directory / "upper" / "state"));
    current.reset();

    // ...and letting go of the last hold deletes it, with the name it was removed under.
    held.reset();
    EXPECT_FALSE(fs::exists(directory));
    const std::vector<std::string> left = entries();
    ASSERT_EQ(left.size(), 2U);
    EXPECT_EQ(left[0].rfind(".sqbox-container-", 0), 0U);
    EXPECT_EQ(left[1], "box");
}

TEST_F(ContainerStoreTest, LettingGoOfARemovedContainerAnotherStartHoldsDeletesNothing) {
    ContainerStore store(data_);
    store.create("box", image_, false);
    auto first = store.find("box");
    auto second = store.find("box");
    ASSERT_TRUE(first && second);
    const fs::path directory = first->info().directory;
    store.remove("box");
    first.reset();
    EXPECT_TRUE(fs::exists(directory)) << "deleted while another start held it";
    second.reset();
    EXPECT_EQ(entries(), std::vector<std::string>{});
}

TEST_F(ContainerStoreTest, AContainerBeingDeletedIsNotFound) {
    ContainerStore store(data_);
    store.create("box", image_, false);
    const fs::path directory = data_ / fs::read_symlink(data_ / "box");
    // A deleter holds the directory exclusively while it works; the name is already gone by then
    // in the store's own removes, but find must not hand out a tree being torn down even if not.
    const int deleting = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(deleting, 0);
    ASSERT_EQ(::flock(deleting, LOCK_EX), 0);
    EXPECT_FALSE(store.find("box"));
    ::close(deleting);
    EXPECT_TRUE(store.find("box"));
}

TEST_F(ContainerStoreTest, RemovingANameThatLinksOutsideTheStoreKeepsItsTarget) {
    ContainerStore store(data_);
    fs::create_directories(data_);
    const fs::path elsewhere = temp_.path() / "rootfs";
    fs::create_directories(elsewhere / "bin");
    fs::create_directory_symlink(elsewhere, data_ / "mine");
    auto held = store.find("mine");
    ASSERT_TRUE(held);
    EXPECT_TRUE(held->info().image.empty());
    held.reset();
    store.remove("mine");
    EXPECT_FALSE(fs::exists(data_ / "mine"));
    EXPECT_TRUE(fs::is_directory(elsewhere / "bin"));
    EXPECT_EQ(entries(), std::vector<std::string>{});
}

TEST_F(ContainerStoreTest, ADirectoryAKilledCreateLeftIsSweptButNotOneBeingCreated) {
    ContainerStore store(data_);
    store.create("box", image_, false);
    const fs::path killed = data_ / ".sqbox-container-0000dead";
    fs::create_directories(killed / "upper" / "deep");
    write(killed / "upper" / "deep" / "file", "x");
    // A create in progress holds its directory exclusively until it is named.
    const fs::path creating = data_ / ".sqbox-container-0000beef";
    fs::create_directories(creating / "upper");
    const int being_created = ::open(creating.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(being_created, 0);
    ASSERT_EQ(::flock(being_created, LOCK_EX), 0);

    store.create("other", image_, false);
    store.remove("other");  // sweeps
    EXPECT_FALSE(fs::exists(killed));
    EXPECT_TRUE(fs::exists(creating / "upper"));
    auto box = store.find("box");
    ASSERT_TRUE(box) << "a named container was swept";
    EXPECT_TRUE(fs::exists(fs::path(box->info().directory) / "upper"));
    ::close(being_created);
}

TEST_F(ContainerStoreTest, ReplacingANameThatIsAFileLeavesNoTrash) {
    ContainerStore store(data_);
    fs::create_directories(data_);
    write(data_ / "box", "not a container");
    store.create("box", image_, true);
    EXPECT_TRUE(store.find("box"));
    const std::vector<std::string> left = entries();
    ASSERT_EQ(left.size(), 2U);
    EXPECT_EQ(left[0].rfind(".sqbox-container-", 0), 0U);
    EXPECT_EQ(left[1], "box");
}

}  // namespace
}  // namespace sqbox
