#include "import/registry_credentials.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "util/errors.h"

namespace sqbox {
namespace {

TEST(Netrc, ParsesEnrootsCredentialsFile) {
    const auto entries = parse_netrc(
        "# NGC\n"
        "machine nvcr.io login $oauthtoken password secret-token\n"
        "machine registry-1.docker.io\n"
        "  login alice\n"
        "  password \"two words\"\n"
        "machine gcr.example login oauth2accesstoken password $(printf '%s' from-command)\n"
        "default login anyone password anything\n");
    ASSERT_EQ(entries.size(), 3U);
    EXPECT_EQ(entries[0].machine, "nvcr.io");
    EXPECT_EQ(entries[0].login, "$oauthtoken");  // only a password starting with $ is evaluated
    EXPECT_EQ(entries[0].password, "secret-token");
    EXPECT_EQ(entries[1].login, "alice");
    EXPECT_EQ(entries[1].password, "two words");
    EXPECT_EQ(entries[2].password, "$(printf '%s' from-command)");  // the rest of the line
    EXPECT_EQ(netrc_user_for(entries, "nvcr.io"), "$oauthtoken");
    EXPECT_EQ(netrc_user_for(entries, "elsewhere"), "");
    auto evaluated = netrc_credentials(entries, "gcr.example", "");
    ASSERT_TRUE(evaluated);
    EXPECT_EQ(evaluated->password, "from-command");
    EXPECT_FALSE(netrc_credentials(entries, "nvcr.io", "someone-else"));
    EXPECT_FALSE(netrc_credentials(entries, "unknown.example", ""));  // `default` is never sent
}

TEST(Netrc, EvaluatesVariablesAsEnrootDoes) {
    ::setenv("SQBOX_TEST_REGISTRY_PASSWORD", "from-variable", 1);
    EXPECT_EQ(evaluate_netrc_password("$SQBOX_TEST_REGISTRY_PASSWORD"), "from-variable");
    EXPECT_EQ(evaluate_netrc_password("plain$dollar"), "plain$dollar");
    EXPECT_THROW(evaluate_netrc_password("$(exit 3)"), Error);
}

TEST(DockerConfig, FindsTheRegistrysAuth) {
    const std::string config = R"({"auths": {
        "https://index.docker.io/v1/": {"auth": ")" +
                               base64_encode("hubuser:hubpass") + R"("},
        "127.0.0.1:5000": {"auth": ")" +
                               base64_encode("local:p:ss") + R"("},
        "plain.example": {"username": "u", "password": "p"}}})";
    auto hub = docker_config_credentials(config, "registry-1.docker.io", "");
    ASSERT_TRUE(hub);
    EXPECT_EQ(hub->user, "hubuser");
    EXPECT_EQ(hub->password, "hubpass");
    auto local = docker_config_credentials(config, "127.0.0.1:5000", "");
    ASSERT_TRUE(local);
    EXPECT_EQ(local->password, "p:ss");  // only the first colon separates
    EXPECT_TRUE(docker_config_credentials(config, "plain.example", "u"));
    EXPECT_FALSE(docker_config_credentials(config, "plain.example", "other"));
    EXPECT_FALSE(docker_config_credentials(config, "127.0.0.1:5001", ""));
    EXPECT_THROW(docker_config_credentials("{not json", "x", ""), Error);
}

TEST(WwwAuthenticate, ParsesBearerAndBasicChallenges) {
    auto bearer = parse_www_authenticate(
        R"(Bearer realm="https://auth.docker.io/token",service="registry.docker.io",)"
        R"(scope="repository:library/ubuntu:pull")");
    ASSERT_TRUE(bearer);
    EXPECT_EQ(bearer->scheme, "Bearer");
    EXPECT_EQ(bearer->parameters["realm"], "https://auth.docker.io/token");
    EXPECT_EQ(bearer->parameters["service"], "registry.docker.io");
    EXPECT_EQ(bearer->parameters["scope"], "repository:library/ubuntu:pull");
    auto basic = parse_www_authenticate(R"(Basic realm="a \"quoted\" realm", charset=UTF-8)");
    ASSERT_TRUE(basic);
    EXPECT_EQ(basic->scheme, "Basic");
    EXPECT_EQ(basic->parameters["realm"], "a \"quoted\" realm");
    EXPECT_EQ(basic->parameters["charset"], "UTF-8");
    EXPECT_FALSE(parse_www_authenticate(R"(Bearer realm="unterminated)"));
    EXPECT_FALSE(parse_www_authenticate(""));
}

TEST(Base64, RoundTrips) {
    for (const char* text : {"", "a", "ab", "abc", "user:p@ss:word\xff"}) {
        EXPECT_EQ(base64_decode(base64_encode(text)), std::string(text));
    }
    EXPECT_EQ(base64_encode("user:pass"), "dXNlcjpwYXNz");
    EXPECT_THROW(base64_decode("not*base64"), Error);
}

}  // namespace
}  // namespace sqbox
