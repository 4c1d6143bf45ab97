// run_in_parser_process: the child that parses an imported image's layers, attacked from inside
// as a hijacked parser would: it opens no file, starts no program or process, reaches no socket
// or other process, shares no memory, stays within its memory limit, and still runs threads and
// writes the descriptors it was given. Its failures reach the parent as one line.
#include "security/parser_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "security/landlock.h"
#include "temp_directory.h"
#include "util/errors.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

namespace fs = std::filesystem;

// "ok" when `work` returned, else the message the parent threw ("died: ..." when the child died).
std::string outcome(const std::function<void()>& work, const std::vector<int>& keep_fds = {},
                    ParserProcessLimits limits = {}, int landlock_abi = landlock_abi_version()) {
    try {
        run_in_parser_process(keep_fds, landlock_abi, limits, work);
        return "ok";
    } catch (const ParserProcessDied& e) {
        return std::string("died: ") + e.what();
    } catch (const Error& e) {
        return e.what();
    }
}

// The work's way to say an attack worked: returning normally.
void expect_refused(const std::string& result, const std::string& why) {
    EXPECT_NE(result, "ok") << "the confined child could " << why;
}

TEST(ParserProcessTest, WritesTheDescriptorsItWasGivenAndRunsThreads) {
    TempDirectory temp("parser");
    const fs::path file = temp.path() / "image";
    UniqueFd out(::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    ASSERT_TRUE(out);
    const int fd = out.get();
    const std::string result = outcome(
        [fd] {
            std::thread worker([fd] {
                if (::pwrite(fd, "threads", 7, 0) != 7) throw system_error("pwrite");
            });
            worker.join();
            if (::ftruncate(fd, 16) != 0) throw system_error("ftruncate");
        },
        {fd});
    EXPECT_EQ(result, "ok");
    EXPECT_EQ(fs::file_size(file), 16U);
    std::string content;
    std::getline(std::ifstream(file), content, '\0');
    EXPECT_EQ(content, "threads");
}

TEST(ParserProcessTest, AnErrorOfTheWorkArrivesAsOneLine) {
    EXPECT_EQ(outcome([] { throw Error("layer 1: damaged\nsecond line"); }),
              "layer 1: damaged second line");
    // An entry's name is the archive's choice, and errors quote it: no terminal control either.
    EXPECT_EQ(outcome([] { throw Error("entry '\x1b]52;c;aGk=\x07\x1b[2K\tx\x7f' leads out"); }),
              "entry ' ]52;c;aGk=  [2K x ' leads out");
}

TEST(ParserProcessTest, OpensNoFileByPath) {
    TempDirectory temp("parser");
    const fs::path secret = temp.path() / "secret";
    std::ofstream(secret) << "secret\n";
    const std::string read = outcome([&] {
        UniqueFd fd(::open(secret.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd) throw system_error("open");
    });
    expect_refused(read, "read a file of its user");
    EXPECT_NE(read.find("Permission denied"), std::string::npos) << read;
    const fs::path planted = temp.path() / "planted";
    const std::string created = outcome([&] {
        UniqueFd fd(::open(planted.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
        if (!fd) throw system_error("create");
    });
    expect_refused(created, "create a file");
    EXPECT_FALSE(fs::exists(planted));
    // Without open: a path-based change (Landlock where the kernel has it).
    if (landlock_abi_version() > 0) {
        const fs::path made = temp.path() / "made";
        expect_refused(outcome([&] {
                           if (::mkdir(made.c_str(), 0700) != 0) throw system_error("mkdir");
                       }),
                       "make a directory");
        EXPECT_FALSE(fs::exists(made));
    }
}

TEST(ParserProcessTest, OpensNoFileByPathWithoutLandlockEither) {
    // As on a kernel without Landlock: the seccomp filter alone.
    TempDirectory temp("parser");
    const fs::path secret = temp.path() / "secret";
    std::ofstream(secret) << "secret\n";
    const std::string read = outcome(
        [&] {
            UniqueFd fd(::open(secret.c_str(), O_RDONLY | O_CLOEXEC));
            if (!fd) throw system_error("open");
        },
        {}, {}, 0);
    EXPECT_EQ(read, "open: Permission denied");
}

// Landlock covers opening, creating and removing files, not their metadata: chmod, chown,
// setxattr and utimes by path are the seccomp filter's to refuse, with Landlock and without.
TEST(ParserProcessTest, ChangesNoFileOfItsUserByPath) {
    for (const int landlock : {landlock_abi_version(), 0}) {
        TempDirectory temp("parser");
        const fs::path victim = temp.path() / "bashrc";
        std::ofstream(victim) << "trusted\n";
        fs::permissions(victim, fs::perms(0600));
        const auto attack = [&](const std::string& what, const std::function<int()>& call) {
            expect_refused(
                outcome(
                    [&] {
                        if (call() != 0) throw system_error(what);
                    },
                    {}, {}, landlock),
                what + " a file of its user (Landlock ABI " + std::to_string(landlock) + ")");
        };
        attack("chmod", [&] { return ::chmod(victim.c_str(), 0666); });
        attack("fchmodat", [&] { return ::fchmodat(AT_FDCWD, victim.c_str(), 0666, 0); });
        attack("chown", [&] { return ::chown(victim.c_str(), ::getuid(), ::getgid()); });
        attack("setxattr", [&] { return ::setxattr(victim.c_str(), "user.planted", "x", 1, 0); });
        attack("utimes", [&] { return ::utimensat(AT_FDCWD, victim.c_str(), nullptr, 0); });
        EXPECT_EQ(fs::status(victim).permissions(), fs::perms(0600));
        if (landlock != 0) continue;
        // What Landlock alone refuses where the kernel has it.
        const fs::path moved = temp.path() / "moved";
        attack("truncate", [&] { return ::truncate(victim.c_str(), 0); });
        attack("rename", [&] { return ::rename(victim.c_str(), moved.c_str()); });
        attack("link", [&] { return ::link(victim.c_str(), moved.c_str()); });
        attack("symlink", [&] { return ::symlink(victim.c_str(), moved.c_str()); });
        attack("mkdir", [&] { return ::mkdir(moved.c_str(), 0700); });
        attack("unlink", [&] { return ::unlink(victim.c_str()); });
        EXPECT_FALSE(fs::exists(moved));
        std::string content;
        std::getline(std::ifstream(victim), content);
        EXPECT_EQ(content, "trusted");
    }
}

// The layers are the caller's files (an OCI layout's, the download cache's blobs), open read-only:
// their mode, owner, attributes and times stay as they are.
TEST(ParserProcessTest, ChangesNoMetadataOfTheDescriptorsItWasGiven) {
    TempDirectory temp("parser");
    const fs::path blob = temp.path() / "blob";
    std::ofstream(blob) << "layer\n";
    fs::permissions(blob, fs::perms(0644));
    UniqueFd layer(::open(blob.c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(layer);
    const int fd = layer.get();
    const auto attack = [&](const std::string& what, const std::function<int()>& call) {
        expect_refused(outcome(
                           [&] {
                               if (call() != 0) throw system_error(what);
                           },
                           {fd}),
                       what + " a layer it reads");
    };
    attack("fchmod", [&] { return ::fchmod(fd, 0666); });
    attack("fchown", [&] { return ::fchown(fd, ::getuid(), ::getgid()); });
    attack("fsetxattr", [&] { return ::fsetxattr(fd, "user.planted", "x", 1, 0); });
    attack("futimens", [&] { return ::futimens(fd, nullptr); });
    EXPECT_EQ(fs::status(blob).permissions(), fs::perms(0644));
}

TEST(ParserProcessTest, StartingAProgramKillsIt) {
    const std::string result = outcome([] {
        char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
        ::execv("/bin/true", argv);
        throw system_error("execv");
    });
    EXPECT_NE(result.find("SIGSYS"), std::string::npos) << result;
    EXPECT_NE(result.find("(the reader crashed)"), std::string::npos) << result;
}

TEST(ParserProcessTest, StartsNoProcess) {
    expect_refused(outcome([] {
                       const pid_t pid = ::fork();
                       if (pid == 0) ::_exit(0);
                       if (pid < 0) throw system_error("fork");
                       (void)::waitpid(pid, nullptr, 0);
                   }),
                   "fork");
}

TEST(ParserProcessTest, OpensNoSocket) {
    for (const int family : {AF_INET, AF_INET6, AF_UNIX, AF_NETLINK}) {
        expect_refused(outcome([family] {
                           UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
                           if (!fd) throw system_error("socket");
                       }),
                       "open a socket of family " + std::to_string(family));
    }
}

TEST(ParserProcessTest, SignalsNoOtherProcess) {
    expect_refused(outcome([] {
                       if (::kill(::getppid(), 0) != 0) throw system_error("kill");
                   }),
                   "signal its parent");
}

TEST(ParserProcessTest, SharesNoMemory) {
    expect_refused(outcome([] {
                       void* shared = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
                                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
                       if (shared == MAP_FAILED) throw system_error("mmap");
                   }),
                   "map shared memory (outside RLIMIT_DATA)");
}

TEST(ParserProcessTest, HoldsNoDescriptorOfItsParentButThoseGiven) {
    TempDirectory temp("parser");
    const fs::path file = temp.path() / "parent";
    UniqueFd parents(::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(parents);
    // Not CLOEXEC either: a fork keeps it, the child must close it.
    const int fd = ::fcntl(parents.get(), F_DUPFD, 10);
    ASSERT_GE(fd, 0);
    UniqueFd leaked(fd);
    expect_refused(outcome([fd] {
                       if (::write(fd, "x", 1) != 1) throw system_error("write");
                   }),
                   "write a descriptor it was not given");
    EXPECT_EQ(fs::file_size(file), 0U);
}

TEST(ParserProcessTest, RunningOutOfMemoryIsOneClearLine) {
    ParserProcessLimits limits;
    limits.data_bytes = uint64_t{64} << 20;
    const std::string result = outcome(
        [] {
            std::vector<char> huge(size_t{256} << 20, 'x');
            if (huge.back() != 'x') throw Error("unreachable");
        },
        {}, limits);
    EXPECT_EQ(result,
              "died: its memory limit of 64 MiB was reached (the reader ran out of memory)");
}

}  // namespace
}  // namespace sqbox
