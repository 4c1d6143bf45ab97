#include "image/squashfs_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "util/errors.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

namespace fs = std::filesystem;

struct CommandResult {
    int status = -1;
    std::string output;  // stdout and stderr
};

struct PipeCloser {
    void operator()(FILE* pipe) const { (void)::pclose(pipe); }
};

CommandResult run(const std::string& command) {
    CommandResult result;
    std::unique_ptr<FILE, PipeCloser> pipe(::popen((command + " 2>&1").c_str(), "r"));
    if (!pipe) return result;
    char buffer[4096];
    size_t count = 0;
    while ((count = std::fread(buffer, 1, sizeof buffer, pipe.get())) > 0) {
        result.output.append(buffer, count);
    }
    int status = ::pclose(pipe.release());
    result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
}

bool have_unsquashfs() {
    return run("unsquashfs -help").output.find("unsquashfs") != std::string::npos;
}

std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::string& content, mode_t mode = 0644) {
    std::ofstream(path, std::ios::binary) << content;
    fs::permissions(path, static_cast<fs::perms>(mode));
}

// Bytes that never repeat at block granularity, so neither compression nor deduplication hides
// a misplaced block.
std::string random_bytes(size_t size, unsigned int seed) {
    std::mt19937 generator(seed);
    std::string bytes(size, '\0');
    for (char& byte : bytes) byte = static_cast<char>(generator() & 0xff);
    return bytes;
}

void set_mtime(const fs::path& path, time_t seconds) {
    const timespec times[2] = {{seconds, 0}, {seconds, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

// Type, permission bits, mtime (not for symlinks, whose times unsquashfs may not restore), and
// content or target of every entry below `root`, keyed by relative path ("" is the root).
std::map<std::string, std::string> describe_tree(const fs::path& root) {
    std::map<std::string, std::string> tree;
    auto describe = [&](const fs::path& path) {
        struct stat st {};
        EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
        std::ostringstream out;
        out << std::oct << (st.st_mode & 07777) << std::dec << " ";
        if (S_ISREG(st.st_mode)) {
            std::string content = read_file(path);
            out << "file size=" << content.size() << " hash=" << std::hash<std::string>{}(content);
        } else if (S_ISDIR(st.st_mode)) {
            out << "dir";
        } else if (S_ISLNK(st.st_mode)) {
            out << "symlink -> " << fs::read_symlink(path).string();
        } else if (S_ISFIFO(st.st_mode)) {
            out << "fifo";
        } else if (S_ISCHR(st.st_mode)) {
            out << "chardev " << major(st.st_rdev) << ":" << minor(st.st_rdev);
        } else {
            out << "other";
        }
        if (!S_ISLNK(st.st_mode)) out << " mtime=" << st.st_mtim.tv_sec;
        // Lexically: fs::relative would resolve the symlinks.
        std::string relative = path.lexically_relative(root).string();
        tree[relative == "." ? "" : relative] = out.str();
    };
    describe(root);
    for (const auto& entry : fs::recursive_directory_iterator(root)) describe(entry.path());
    return tree;
}

class SquashfsWriterTest : public ::testing::Test {
  protected:
    void SetUp() override {
        char pattern[] = "/tmp/sqbox-sqw-test-XXXXXX";
        ASSERT_NE(::mkdtemp(pattern), nullptr);
        dir_ = pattern;
        source_ = dir_ / "tree";
        fs::create_directory(source_);
    }
    void TearDown() override {
        std::error_code ignored;
        fs::remove_all(dir_, ignored);
    }

    // Nested directories, empty/small/multi-block/sparse files, modes 0600 and 0755, symlinks
    // (one pointing outside the tree), a FIFO, an empty directory, a hard link and a top-level
    // ".lock" that is to be left out (a nested one is kept).
    void build_tree() {
        write_file(source_ / ".lock", "");
        write_file(source_ / "empty", "");
        write_file(source_ / "small.txt", "hello\n");
        write_file(source_ / "big.bin", random_bytes(3 * 1024 * 1024 + 12345, 1));
        write_file(source_ / "sparse.bin",
                   random_bytes(131072, 2) + std::string(262144, '\0') + random_bytes(1000, 3));
        write_file(source_ / "private", "secret\n", 0600);
        write_file(source_ / "script.sh", "#!/bin/sh\necho hi\n", 0755);
        fs::create_directories(source_ / "a" / "b" / "c");
        write_file(source_ / "a" / "b" / "c" / "deep.txt", "deep\n");
        write_file(source_ / "a" / ".lock", "nested lock stays\n");
        fs::create_directory(source_ / "empty_dir");
        fs::create_symlink("small.txt", source_ / "link");
        fs::create_symlink("/", source_ / "outside");
        fs::create_symlink("a/b", source_ / "dirlink");
        fs::create_hard_link(source_ / "small.txt", source_ / "a" / "hardlink");
        ASSERT_EQ(::mkfifo((source_ / "fifo").c_str(), 0640), 0);
        if (::geteuid() == 0) {
            ASSERT_EQ(::mknod((source_ / "null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
        }
        for (const auto& entry : fs::recursive_directory_iterator(source_)) {
            set_mtime(entry.path(), 1600000000);
        }
        set_mtime(source_ / "a" / "b", 1500000000);
        set_mtime(source_, 1400000000);
    }

    void write_image(const fs::path& output, const SquashfsWriteOptions& options) {
        UniqueFd fd(::open(source_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
        ASSERT_TRUE(fd.valid());
        write_squashfs_image(fd.get(), output.string(), options);
    }

    static SquashfsWriteOptions default_options() {
        SquashfsWriteOptions options;
        options.exclude_top_level = {".lock"};
        return options;
    }

    std::string write_error(const fs::path& output) {
        try {
            write_image(output, default_options());
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    }

    fs::path dir_;
    fs::path source_;
};

TEST_F(SquashfsWriterTest, RoundTripsATreeThroughUnsquashfs) {
    if (!have_unsquashfs()) GTEST_SKIP() << "unsquashfs (squashfs-tools) is not installed";
    build_tree();
    const fs::path image = dir_ / "image.sqsh";
    write_image(image, default_options());

    const fs::path extracted = dir_ / "extracted";
    CommandResult unpack =
        run("unsquashfs -no-xattrs -d " + extracted.string() + " " + image.string());
    ASSERT_EQ(unpack.status, 0) << unpack.output;

    std::map<std::string, std::string> expected = describe_tree(source_);
    ASSERT_EQ(expected.erase(".lock"), 1u);
    std::map<std::string, std::string> actual = describe_tree(extracted);
    EXPECT_EQ(actual, expected);
    EXPECT_FALSE(fs::exists(fs::symlink_status(extracted / ".lock")));
    EXPECT_EQ(read_file(extracted / "a" / ".lock"), "nested lock stays\n");

    CommandResult listing = run("unsquashfs -lls " + image.string());
    ASSERT_EQ(listing.status, 0) << listing.output;
    std::istringstream lines(listing.output);
    std::string line;
    int entries = 0;
    while (std::getline(lines, line)) {
        std::istringstream fields(line);
        std::string mode;
        std::string owner;
        fields >> mode >> owner;
        if (mode.size() != 10 || std::string("-dlcbps").find(mode[0]) == std::string::npos) {
            continue;
        }
        ++entries;
        EXPECT_EQ(owner, "root/root") << line;
    }
    EXPECT_EQ(entries, static_cast<int>(expected.size())) << listing.output;

    CommandResult super = run("unsquashfs -s " + image.string());
    EXPECT_NE(super.output.find("Compression gzip"), std::string::npos) << super.output;
    EXPECT_NE(super.output.find("Block size 131072"), std::string::npos) << super.output;
    EXPECT_EQ(fs::file_size(image) % 4096, 0u);
}

TEST_F(SquashfsWriterTest, KeepsOwnersWithoutAllRoot) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file another owner";
    if (!have_unsquashfs()) GTEST_SKIP() << "unsquashfs (squashfs-tools) is not installed";
    write_file(source_ / "owned", "x");
    ASSERT_EQ(::chown((source_ / "owned").c_str(), 1234, 5678), 0);
    SquashfsWriteOptions options;
    options.all_root = false;
    write_image(dir_ / "image.sqsh", options);
    CommandResult listing = run("unsquashfs -lln " + (dir_ / "image.sqsh").string());
    EXPECT_NE(listing.output.find("1234/5678"), std::string::npos) << listing.output;

    write_image(dir_ / "rooted.sqsh", SquashfsWriteOptions{});
    listing = run("unsquashfs -lln " + (dir_ / "rooted.sqsh").string());
    EXPECT_EQ(listing.output.find("1234/5678"), std::string::npos) << listing.output;
}

// The export's rule: setuid/setgid bits stay only on files the reference (the image) has with
// those bits and the same bytes; whatever was added or changed on top loses them.
TEST_F(SquashfsWriterTest, SetIdBitsStayOnlyWhereTheReferenceHasTheSameFile) {
    if (!have_unsquashfs()) GTEST_SKIP() << "unsquashfs (squashfs-tools) is not installed";
    const fs::path reference = dir_ / "reference";
    fs::create_directories(reference / "bin");
    fs::create_directories(source_ / "bin");
    const std::map<std::string, std::pair<std::string, mode_t>> image_files = {
        {"bin/su", {"the image's su", 04755}},
        {"bin/wall", {"the image's wall", 02755}},
        {"bin/changed", {"the image's bytes", 04755}},
        {"bin/plain", {"an ordinary program", 0755}},
        {"bin/setgid-only", {"setgid in the image", 02755}},
    };
    for (const auto& [name, file] : image_files) {
        write_file(reference / name, file.first);
        ASSERT_EQ(::chmod((reference / name).c_str(), file.second), 0);
    }
    // The tree as a container left it: unchanged image files, and what its payload did.
    const std::map<std::string, std::pair<std::string, mode_t>> tree_files = {
        {"bin/su", {"the image's su", 04755}},                // unchanged: kept
        {"bin/wall", {"the image's wall", 02755}},            // unchanged: kept
        {"bin/changed", {"other bytes here!", 04755}},        // rewritten: dropped
        {"bin/plain", {"an ordinary program", 06755}},        // made setuid: dropped
        {"bin/setgid-only", {"setgid in the image", 06755}},  // setuid added: dropped
        {"bin/mine", {"the payload's shell", 06755}},         // new: dropped
        {"link/su", {"the image's su", 04755}},               // same bytes, other path: dropped
    };
    fs::create_directories(source_ / "link");
    for (const auto& [name, file] : tree_files) {
        write_file(source_ / name, file.first);
        ASSERT_EQ(::chmod((source_ / name).c_str(), file.second), 0);
    }
    // A path the reference reaches only through a symlink does not count.
    fs::create_directory_symlink("bin", reference / "link");

    UniqueFd reference_fd(::open(reference.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(reference_fd.valid());
    UniqueFd fd(::open(source_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(fd.valid());
    SquashfsWriteOptions options;
    options.setid_reference_fd = reference_fd.get();
    const SquashfsWriteSummary summary =
        write_squashfs_image(fd.get(), (dir_ / "image.sqsh").string(), options);
    EXPECT_EQ(summary.setid_dropped,
              (std::vector<std::string>{"bin/changed", "bin/mine", "bin/plain", "bin/setgid-only",
                                        "link/su"}));

    CommandResult listing = run("unsquashfs -lln " + (dir_ / "image.sqsh").string());
    ASSERT_EQ(listing.status, 0) << listing.output;
    std::map<std::string, std::string> modes;
    std::istringstream lines(listing.output);
    for (std::string line; std::getline(lines, line);) {
        const size_t slash = line.find("squashfs-root/");
        if (slash != std::string::npos) modes[line.substr(slash + 14)] = line.substr(0, 10);
    }
    EXPECT_EQ(modes["bin/su"], "-rwsr-xr-x");
    EXPECT_EQ(modes["bin/wall"], "-rwxr-sr-x");
    for (const char* name :
         {"bin/changed", "bin/plain", "bin/setgid-only", "bin/mine", "link/su"}) {
        EXPECT_EQ(modes[name], "-rwxr-xr-x") << name;
    }
    // Without a reference, the tree's bits are packed as they are.
    write_image(dir_ / "plain.sqsh", SquashfsWriteOptions{});
    EXPECT_NE(run("unsquashfs -lln " + (dir_ / "plain.sqsh").string()).output.find("-rwsr-sr-x"),
              std::string::npos);
}

TEST_F(SquashfsWriterTest, RefusesAnExistingOutputAndLeavesItAlone) {
    write_file(source_ / "file", "content");
    const fs::path output = dir_ / "existing.sqsh";
    write_file(output, "precious");
    std::string error = write_error(output);
    EXPECT_NE(error.find(output.string()), std::string::npos) << error;
    EXPECT_NE(error.find("File exists"), std::string::npos) << error;
    EXPECT_EQ(read_file(output), "precious");
}

TEST_F(SquashfsWriterTest, UnreadableFileFailsAndLeavesNoOutput) {
    if (::geteuid() == 0) GTEST_SKIP() << "root reads files of mode 000 anyway";
    build_tree();
    write_file(source_ / "a" / "unreadable", "no", 0000);
    const fs::path output = dir_ / "image.sqsh";
    std::string error = write_error(output);
    EXPECT_NE(error.find("a/unreadable"), std::string::npos) << error;
    EXPECT_NE(error.find("Permission denied"), std::string::npos) << error;
    EXPECT_FALSE(fs::exists(output));
}

// A failure while writing the image (here: the file size limit), which also runs as root. In a
// child process, so the limit and the ignored SIGXFSZ stay there; the child checks that the
// output is gone (exit status 0).
TEST_F(SquashfsWriterTest, FailedImageWriteLeavesNoOutput) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    build_tree();
    const fs::path output = dir_ / "image.sqsh";
    auto write_under_limit = [&] {
        int status = 1;
        (void)std::signal(SIGXFSZ, SIG_IGN);
        const rlim_t max_bytes = rlim_t{256} * 1024;
        const rlimit limit{max_bytes, max_bytes};
        if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) status = 3;
        try {
            if (status == 1) write_image(output, default_options());
        } catch (const Error& e) {
            (void)std::fprintf(stderr, "%s\n", e.what());
            status = fs::exists(output) ? 2 : 0;
        }
        TearDown();  // _Exit skips the fixture's own cleanup
        std::_Exit(status);
    };
    // The threadsafe style re-runs the test from the start, in a fresh temporary directory.
    EXPECT_EXIT(write_under_limit(), ::testing::ExitedWithCode(0),
                "writing squashfs image /tmp/.*/image.sqsh: .*File too large");
}

TEST_F(SquashfsWriterTest, SameTreeGivesIdenticalImages) {
    build_tree();
    write_image(dir_ / "first.sqsh", default_options());
    write_image(dir_ / "second.sqsh", default_options());
    EXPECT_TRUE(read_file(dir_ / "first.sqsh") == read_file(dir_ / "second.sqsh"));
}

TEST_F(SquashfsWriterTest, LeavesItsOwnOutputOutOfTheImage) {
    if (!have_unsquashfs()) GTEST_SKIP() << "unsquashfs (squashfs-tools) is not installed";
    write_file(source_ / "file", "content");
    const fs::path image = source_ / "self.sqsh";
    write_image(image, default_options());
    CommandResult listing = run("unsquashfs -l " + image.string());
    ASSERT_EQ(listing.status, 0) << listing.output;
    EXPECT_NE(listing.output.find("squashfs-root/file"), std::string::npos) << listing.output;
    EXPECT_EQ(listing.output.find("self.sqsh"), std::string::npos) << listing.output;
}

TEST_F(SquashfsWriterTest, RejectsANonDirectory) {
    write_file(dir_ / "plain", "x");
    UniqueFd fd(::open((dir_ / "plain").c_str(), O_PATH | O_CLOEXEC));
    ASSERT_TRUE(fd.valid());
    const fs::path output = dir_ / "image.sqsh";
    EXPECT_THROW(write_squashfs_image(fd.get(), output.string(), SquashfsWriteOptions{}), Error);
    EXPECT_FALSE(fs::exists(output));
}

}  // namespace
}  // namespace sqbox
