// The user's image server key (runtime/server_key.h): proofs that differ with anything they
// cover (the role, the identity, the launcher's pid, either challenge, the key), a key received
// only whole, and a key file used only when no one else could have read or chosen it.
#include "runtime/server_key.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "temp_directory.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

namespace fs = std::filesystem;

TEST(KeyProof, HoldsForItsOwnInputsOnly) {
    const ServerKey key = random_key_bytes();
    const ServerKey other_key = random_key_bytes();
    const std::string theirs = key_text(random_key_bytes());
    const std::string mine = key_text(random_key_bytes());
    const ServerKey proof = key_proof(key, ProofRole::kLauncher, "image a", 42, theirs, mine);
    const std::string text = key_text(proof);
    EXPECT_EQ(key_text(key_proof(key, ProofRole::kLauncher, "image a", 42, theirs, mine)), text);
    EXPECT_TRUE(is_key_proof(text, key, ProofRole::kLauncher, "image a", 42, theirs, mine));
    EXPECT_FALSE(is_key_proof(text, other_key, ProofRole::kLauncher, "image a", 42, theirs, mine));
    EXPECT_FALSE(is_key_proof(text, key, ProofRole::kServer, "image a", 42, theirs, mine));
    EXPECT_FALSE(is_key_proof(text, key, ProofRole::kLauncher, "image b", 42, theirs, mine));
    // Another launcher's connection (a process passing this one's messages on connects as itself).
    EXPECT_FALSE(is_key_proof(text, key, ProofRole::kLauncher, "image a", 43, theirs, mine));
    EXPECT_FALSE(is_key_proof(text, key, ProofRole::kLauncher, "image a", 42, mine, theirs));
    EXPECT_FALSE(
        is_key_proof(text.substr(1), key, ProofRole::kLauncher, "image a", 42, theirs, mine));
    EXPECT_FALSE(is_key_proof("", key, ProofRole::kLauncher, "image a", 42, theirs, mine));
    // Where one part ends is part of what is proven.
    EXPECT_NE(key_text(key_proof(key, ProofRole::kLauncher, "ab", 1, "c", "")),
              key_text(key_proof(key, ProofRole::kLauncher, "a", 1, "bc", "")));
    EXPECT_NE(key_text(key_proof(key, ProofRole::kLauncher, "a1", 2, "", "")),
              key_text(key_proof(key, ProofRole::kLauncher, "a", 12, "", "")));
}

TEST(ServerKeyTag, DiffersBetweenKeysAndIsStable) {
    const ServerKey key = random_key_bytes();
    EXPECT_EQ(server_key_tag(key), server_key_tag(key));
    EXPECT_EQ(server_key_tag(key).size(), 16U);
    EXPECT_NE(server_key_tag(key), server_key_tag(random_key_bytes()));
}

ServerKey key_from_pipe(const std::string& bytes) {
    Pipe pipe = make_pipe("a key");
    EXPECT_TRUE(write_all(pipe.write_end.get(), bytes.data(), bytes.size()));
    pipe.write_end.reset();
    return read_server_key(pipe.read_end.get());
}

TEST(ReadServerKey, TakesExactlyAKey) {
    const ServerKey key = random_key_bytes();
    EXPECT_EQ(key_from_pipe(key_text(key)), key);
    EXPECT_THROW(key_from_pipe(key_text(key).substr(0, 31)), Error);
    EXPECT_THROW(key_from_pipe(key_text(key) + "x"), Error);
    EXPECT_THROW(key_from_pipe(""), Error);
}

TEST(UserServerKey, MakesAPrivateKeyOnceAndKeepsIt) {
    TempDirectory temp("server-key");
    const fs::path cache = temp.path() / "cache" / "sqbox";
    const ServerKey key = user_server_key(cache);
    struct stat st {};
    ASSERT_EQ(::stat((cache / "image-server.key").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600U);
    EXPECT_EQ(st.st_size, 32);
    ASSERT_EQ(::stat(cache.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0700U);
    EXPECT_EQ(user_server_key(cache), key);
    EXPECT_EQ(std::distance(fs::directory_iterator(cache), fs::directory_iterator()), 1);
}

TEST(UserServerKey, RefusesAKeyOthersCouldReadOrChoose) {
    TempDirectory temp("server-key");
    const fs::path& cache = temp.path();
    fs::permissions(cache, fs::perms::owner_all, fs::perm_options::replace);
    const fs::path file = cache / "image-server.key";
    (void)user_server_key(cache);
    fs::permissions(file, fs::perms::others_read, fs::perm_options::add);
    EXPECT_THROW(user_server_key(cache), Error);
    fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write,
                    fs::perm_options::replace);
    (void)user_server_key(cache);
    fs::permissions(cache, fs::perms::group_write, fs::perm_options::add);
    EXPECT_THROW(user_server_key(cache), Error);
    fs::permissions(cache, fs::perms::owner_all, fs::perm_options::replace);
    fs::resize_file(file, 31);
    EXPECT_THROW(user_server_key(cache), Error);
    fs::remove(file);
    std::ofstream(cache / "elsewhere") << std::string(32, 'k');
    fs::permissions(cache / "elsewhere", fs::perms::owner_read, fs::perm_options::replace);
    fs::create_symlink("elsewhere", file);
    EXPECT_THROW(user_server_key(cache), Error);
    EXPECT_THROW(user_server_key(""), Error);
}

}  // namespace
}  // namespace sqbox
