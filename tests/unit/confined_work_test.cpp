// run_confined: the child that reads untrusted images for sqbox reaches only its directory, is
// bounded in memory and time, and reports what it did or why it failed.
#include "security/confined_work.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "security/landlock.h"
#include "temp_directory.h"
#include "util/errors.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

namespace fs = std::filesystem;

class ConfinedWorkTest : public ::testing::Test {
  protected:
    void SetUp() override {
        fs::create_directory(dir_ / "inside");
        std::ofstream(dir_ / "outside.txt") << "outside\n";
        inside_.reset(::open((dir_ / "inside").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        ASSERT_TRUE(inside_);
    }
    TempDirectory temp_{"confined"};
    const fs::path& dir_ = temp_.path();
    UniqueFd inside_;
};

TEST_F(ConfinedWorkTest, ReturnsTheReportAndWritesItsDirectory) {
    const int dir = inside_.get();
    const std::string report = run_confined(dir, {}, [dir] {
        UniqueFd file(::openat(dir, "made", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
        if (!file || ::write(file.get(), "x", 1) != 1) throw system_error("made");
        return std::string("done");
    });
    EXPECT_EQ(report, "done");
    EXPECT_TRUE(fs::is_regular_file(dir_ / "inside" / "made"));
}

TEST_F(ConfinedWorkTest, AnErrorOfTheWorkIsThrownWithItsMessage) {
    try {
        (void)run_confined(inside_.get(), {}, []() -> std::string { throw Error("bad image"); });
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "bad image");
    }
}

// Errors quote the image's names, which may hold anything but '/' and NUL: one line, and no
// terminal control reaches the caller's terminal.
TEST_F(ConfinedWorkTest, AnErrorArrivesAsOneLineWithoutControlCharacters) {
    try {
        (void)run_confined(inside_.get(), {}, []() -> std::string {
            throw Error("the name '\x1b]52;c;aGk=\x07\n\x1b[2J\x7f' in /");
        });
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_STREQ(e.what(), "the name ' ]52;c;aGk=   [2J ' in /");
    }
}

TEST_F(ConfinedWorkTest, ReachesNoFileOutsideItsDirectory) {
    if (landlock_abi_version() == 0) GTEST_SKIP() << "Landlock is not available on this kernel";
    const std::string outside = (dir_ / "outside.txt").string();
    const std::string elsewhere = (dir_ / "created-outside").string();
    const std::string report = run_confined(inside_.get(), {}, [&] {
        std::string seen;
        seen += ::open(outside.c_str(), O_RDONLY | O_CLOEXEC) < 0 && errno == EACCES ? "r" : "R";
        seen += ::open("/etc/passwd", O_RDONLY | O_CLOEXEC) < 0 && errno == EACCES ? "r" : "R";
        seen += ::open(elsewhere.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600) < 0 ? "w" : "W";
        seen += ::mkdir(elsewhere.c_str(), 0700) != 0 ? "d" : "D";
        return seen;
    });
    EXPECT_EQ(report, "rrwd");
    EXPECT_FALSE(fs::exists(elsewhere));
}

TEST_F(ConfinedWorkTest, KeepsNoDescriptorTerminalOrOtherSystemCall) {
    UniqueFd leaked(::open((dir_ / "outside.txt").c_str(), O_RDONLY));  // not close-on-exec
    UniqueFd kept(::open((dir_ / "outside.txt").c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(leaked && kept);
    const int leaked_fd = leaked.get();
    const int kept_fd = kept.get();
    const int dir = inside_.get();
    const std::string outside = (dir_ / "outside.txt").string();
    const std::string report = run_confined(dir, {kept_fd}, [=] {
        std::string seen;
        char byte = 0;
        seen += ::pread(leaked_fd, &byte, 1, 0) < 0 && errno == EBADF ? "l" : "L";  // closed
        seen += ::pread(kept_fd, &byte, 1, 0) == 1 ? "k" : "K";                     // kept
        // The kept file (the caller's image) keeps its mode and times, and is not duplicated.
        seen += ::fchmod(kept_fd, 0666) != 0 && errno == EPERM ? "m" : "M";
        seen += ::futimens(kept_fd, nullptr) != 0 && errno == EPERM ? "u" : "U";
        seen += ::dup(kept_fd) < 0 && errno == EPERM ? "d" : "D";
        // No O_PATH descriptor, which Landlock would let through.
        seen += ::open(outside.c_str(), O_PATH | O_CLOEXEC) < 0 && errno == EPERM ? "o" : "O";
        seen += ::read(0, &byte, 1) == 0 ? "n" : "N";  // stdin is /dev/null: at its end at once
        seen += ::socket(AF_UNIX, SOCK_STREAM, 0) < 0 && errno == EPERM ? "s" : "S";
        seen += ::kill(::getppid(), 0) != 0 ? "p" : "P";
        seen += ::ioctl(1, TIOCSTI, "x") != 0 ? "t" : "T";
        seen += ::fork() < 0 ? "f" : "F";  // no process it could leave behind
        // Its own files it may set up; no capability, even for a root caller, to give them away.
        UniqueFd made(::openat(dir, "mine", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
        seen += made && ::fchmod(made.get(), 0644) == 0 ? "w" : "W";
        seen += made && ::fchown(made.get(), 12345, static_cast<gid_t>(-1)) != 0 ? "c" : "C";
        return seen;
    });
    EXPECT_EQ(report, "lkmudonsptfwc");
    struct stat after {};
    ASSERT_EQ(::stat((dir_ / "outside.txt").c_str(), &after), 0);
    EXPECT_EQ(after.st_mode & 07777, 0644U);
}

TEST_F(ConfinedWorkTest, MemoryAndTimeAreBounded) {
    ConfinedLimits limits;
    limits.address_space_bytes = uint64_t{256} << 20;
    limits.time_limit = std::chrono::milliseconds(300);
    EXPECT_THROW((void)run_confined(
                     inside_.get(), {},
                     [] {
                         std::vector<char> huge(size_t{1} << 30, 'x');  // 1 GiB
                         return std::string(1, huge[12345]);
                     },
                     limits),
                 Error);
    try {
        (void)run_confined(
            inside_.get(), {},
            [] {
                // A runaway parser: busy, never done.
                volatile uint64_t spins = 0;
                for (;;) {
                    spins = spins + 1;
                }
                return std::string("done");
            },
            limits);
        FAIL() << "no error";
    } catch (const Error& e) {
        // Killed at the limit, not waited for.
        EXPECT_NE(std::strstr(e.what(), "took longer than 300 ms"), nullptr) << e.what();
    }
    // One that closes every descriptor, its report's included, and then sleeps using no CPU.
    try {
        (void)run_confined(
            inside_.get(), {},
            [] {
                (void)::syscall(SYS_close_range, 0U, ~0U, 0U);
                int word = 0;
                for (;;) (void)::syscall(SYS_futex, &word, FUTEX_WAIT, 0, nullptr, nullptr, 0);
                return std::string("done");
            },
            limits);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::strstr(e.what(), "took longer than 300 ms"), nullptr) << e.what();
    }
}

}  // namespace
}  // namespace sqbox

namespace sqbox {
namespace {

// Symlinks only when asked (an unpacked image keeps its own), and only beneath its directory.
TEST_F(ConfinedWorkTest, MakesSymlinksOnlyWhenAskedAndOnlyInside) {
    if (landlock_abi_version() == 0) GTEST_SKIP() << "Landlock is not available on this kernel";
    const int dir = inside_.get();
    auto try_symlinks = [&](bool allowed) {
        ConfinedLimits limits;
        limits.make_symlinks = allowed;
        const std::string outside = dir_.string();
        return run_confined(
            dir, {},
            [dir, outside] {
                const int inside = ::symlinkat("/etc/passwd", dir, "link");
                const int inside_errno = errno;
                // Outside its directory, by an absolute path: Landlock refuses it.
                const int out = ::symlinkat("/etc/passwd", AT_FDCWD, (outside + "/out").c_str());
                return std::to_string(inside == 0 ? 0 : inside_errno) + " " +
                       std::to_string(out == 0 ? 0 : errno);
            },
            limits);
    };
    EXPECT_EQ(try_symlinks(false), std::to_string(EPERM) + " " + std::to_string(EPERM));
    EXPECT_FALSE(fs::is_symlink(dir_ / "inside" / "link"));
    const std::string allowed = try_symlinks(true);
    EXPECT_TRUE(allowed.starts_with("0 ")) << allowed;
    EXPECT_NE(allowed, "0 0");
    EXPECT_TRUE(fs::is_symlink(dir_ / "inside" / "link"));
    EXPECT_FALSE(fs::exists(fs::symlink_status(dir_ / "out")));
}

}  // namespace
}  // namespace sqbox
