#include "import/docker_reference.h"

#include <gtest/gtest.h>

#include "util/errors.h"

namespace sqbox {
namespace {

struct Case {
    const char* uri;
    const char* user;
    const char* registry;
    const char* image;
    const char* reference;
};

constexpr const char* kDigest =
    "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

TEST(DockerReference, ParsesAsEnrootDoes) {
    const Case cases[] = {
        // Docker Hub official images: library/ and latest.
        {"docker://ubuntu", "", "registry-1.docker.io", "library/ubuntu", "latest"},
        {"docker://ubuntu:22.04", "", "registry-1.docker.io", "library/ubuntu", "22.04"},
        {"docker://alice@ubuntu:22.04", "alice", "registry-1.docker.io", "library/ubuntu", "22.04"},
        // A Hub namespace: the first part has neither "." nor ":".
        {"docker://nvidia/cuda:12.4.1-base", "", "registry-1.docker.io", "nvidia/cuda",
         "12.4.1-base"},
        {"docker://localhost/app", "", "registry-1.docker.io", "localhost/app", "latest"},
        // enroot's REGISTRY#IMAGE.
        {"docker://nvcr.io#nvidia/pytorch:24.01-py3", "", "nvcr.io", "nvidia/pytorch", "24.01-py3"},
        {"docker://$oauthtoken@nvcr.io#nvidia/pytorch:24.01-py3", "$oauthtoken", "nvcr.io",
         "nvidia/pytorch", "24.01-py3"},
        {"docker://127.0.0.1:5000#test/busybox", "", "127.0.0.1:5000", "test/busybox", "latest"},
        {"docker://127.0.0.1:5000#busybox:1", "", "127.0.0.1:5000", "busybox", "1"},
        // Docker's REGISTRY/IMAGE when the first part looks like a host.
        {"docker://nvcr.io/nvidia/pytorch:24.01-py3", "", "nvcr.io", "nvidia/pytorch", "24.01-py3"},
        {"docker://bob@localhost:5000/team/app:v1", "bob", "localhost:5000", "team/app", "v1"},
        // Hub aliases are one registry, with library/ for single names.
        {"docker://docker.io#ubuntu", "", "registry-1.docker.io", "library/ubuntu", "latest"},
        {"docker://index.docker.io#library/ubuntu:24.04", "", "registry-1.docker.io",
         "library/ubuntu", "24.04"},
        {"docker://docker.io/ubuntu:24.04", "", "registry-1.docker.io", "library/ubuntu", "24.04"},
        {"docker://registry-1.docker.io#foo/bar", "", "registry-1.docker.io", "foo/bar", "latest"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.uri);
        const DockerReference parsed = parse_docker_uri(c.uri);
        EXPECT_EQ(parsed.user, c.user);
        EXPECT_EQ(parsed.registry, c.registry);
        EXPECT_EQ(parsed.image, c.image);
        EXPECT_EQ(parsed.reference, c.reference);
    }
}

TEST(DockerReference, ADigestWinsOverATag) {
    const std::string digest = kDigest;
    for (const std::string& uri :
         {"docker://ubuntu@" + digest, "docker://ubuntu:22.04@" + digest}) {
        SCOPED_TRACE(uri);
        const DockerReference parsed = parse_docker_uri(uri);
        EXPECT_EQ(parsed.image, "library/ubuntu");
        EXPECT_EQ(parsed.reference, digest);
        EXPECT_TRUE(parsed.by_digest());
    }
    for (const std::string& uri :
         {"docker://nvcr.io#nvidia/cuda:12@" + digest, "docker://nvcr.io/nvidia/cuda@" + digest}) {
        SCOPED_TRACE(uri);
        const DockerReference parsed = parse_docker_uri(uri);
        EXPECT_EQ(parsed.registry, "nvcr.io");
        EXPECT_EQ(parsed.image, "nvidia/cuda");
        EXPECT_EQ(parsed.reference, digest);
    }
}

TEST(DockerReference, RefusesWhatEnrootRefuses) {
    for (const char* uri : {
             "ubuntu",                           // no scheme
             "docker://",                        // nothing
             "docker://nvcr.io#Nvidia/pytorch",  // upper case in a repository
             "docker://nvcr.io#nvidia/pytorch:bad tag",
             "docker://nvcr.io#",
             "docker://a#b#c",
         }) {
        SCOPED_TRACE(uri);
        EXPECT_THROW(parse_docker_uri(uri), Error);
    }
}

TEST(DockerReference, ReadsUserAndTagBeforeAnUnknownDigestAlgorithm) {
    // As in enroot: "@md5:abc" is no digest, so this is USER@IMAGE:TAG.
    const DockerReference parsed = parse_docker_uri("docker://ubuntu@md5:abc");
    EXPECT_EQ(parsed.user, "ubuntu");
    EXPECT_EQ(parsed.image, "library/md5");
    EXPECT_EQ(parsed.reference, "abc");
}

TEST(DockerReference, RegistryHostDropsThePort) {
    EXPECT_EQ(registry_host("127.0.0.1:5000"), "127.0.0.1");
    EXPECT_EQ(registry_host("nvcr.io"), "nvcr.io");
    EXPECT_EQ(registry_host("[::1]"), "[::1]");
    EXPECT_EQ(registry_host("[::1]:5000"), "[::1]");
}

}  // namespace
}  // namespace sqbox
