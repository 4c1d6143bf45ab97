#include "import/engine_sources.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "cli/import_command.h"
#include "util/errors.h"

namespace sqbox {
namespace {

// Sets an environment variable for one scope, restoring what was there.
class ScopedVariable {
  public:
    ScopedVariable(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        if (value != nullptr) {
            ::setenv(name, value, 1);
        } else {
            ::unsetenv(name);
        }
    }
    ScopedVariable(const ScopedVariable&) = delete;
    ScopedVariable& operator=(const ScopedVariable&) = delete;
    ~ScopedVariable() {
        if (old_) {
            ::setenv(name_, old_->c_str(), 1);
        } else {
            ::unsetenv(name_);
        }
    }

  private:
    const char* name_;
    std::optional<std::string> old_;
};

TEST(EngineUri, TakesEnrootsSyntax) {
    EXPECT_TRUE(is_engine_image_uri("dockerd://ubuntu"));
    EXPECT_TRUE(is_engine_image_uri("podman://ubuntu"));
    EXPECT_FALSE(is_engine_image_uri("docker://ubuntu"));
    const auto reference = parse_engine_uri("dockerd://nvcr.io/nvidia/cuda:12.4");
    EXPECT_EQ(reference.engine, "dockerd");
    EXPECT_EQ(reference.image, "nvcr.io/nvidia/cuda:12.4");
    EXPECT_EQ(parse_engine_uri("podman://sha256:0123abc").image, "sha256:0123abc");
}

TEST(EngineUri, RefusesWhatIsNoImageName) {
    // The name becomes a URL path: nothing that could walk out of /images/, nothing encoded.
    for (const char* uri :
         {"dockerd://", "dockerd://a/../../containers/x", "podman://../version", "podman://a//b",
          "podman://./a", "dockerd://a b", "dockerd://a?b", "dockerd://a%2e",
          "dockerd://a@sha256:1", "podman://a#b", "podman:/a"}) {
        EXPECT_THROW(parse_engine_uri(uri), Error) << uri;
    }
}

TEST(EngineUri, NamesTheImageAsEnrootDoes) {
    EXPECT_EQ(cli::default_image_name("dockerd://nvidia/cuda:12.4"), "nvidia+cuda+12.4");
    EXPECT_EQ(cli::default_image_name("podman://localhost/app"), "localhost+app");
}

TEST(EngineSocket, DockerHostOrTheDefault) {
    {
        ScopedVariable host("DOCKER_HOST", nullptr);
        EXPECT_EQ(engine_socket_path("dockerd"), "/var/run/docker.sock");
    }
    {
        ScopedVariable host("DOCKER_HOST", "unix:///tmp/d.sock");
        EXPECT_EQ(engine_socket_path("dockerd"), "/tmp/d.sock");
    }
    {
        // Another daemon than the one meant is never asked instead.
        ScopedVariable host("DOCKER_HOST", "tcp://127.0.0.1:2375");
        EXPECT_THROW(engine_socket_path("dockerd"), Error);
    }
}

TEST(EngineSocket, ContainerHostOrTheUsersService) {
    ScopedVariable runtime("XDG_RUNTIME_DIR", "/run/user/4242");
    {
        ScopedVariable host("CONTAINER_HOST", nullptr);
        EXPECT_EQ(engine_socket_path("podman"), ::geteuid() == 0
                                                    ? "/run/podman/podman.sock"
                                                    : "/run/user/4242/podman/podman.sock");
    }
    {
        ScopedVariable host("CONTAINER_HOST", "unix:///tmp/p.sock");
        EXPECT_EQ(engine_socket_path("podman"), "/tmp/p.sock");
    }
    {
        ScopedVariable host("CONTAINER_HOST", "ssh://user@host/run/podman/podman.sock");
        EXPECT_THROW(engine_socket_path("podman"), Error);
    }
}

}  // namespace
}  // namespace sqbox
