#include "import/image_manifest.h"

#include <gtest/gtest.h>

#include "util/errors.h"

namespace sqbox {
namespace {

std::string digest_of(char c) {
    return "sha256:" + std::string(64, c);
}

std::string descriptor(const std::string& media_type, char c, int size) {
    return R"({"mediaType":")" + media_type + R"(","digest":")" + digest_of(c) + R"(","size":)" +
           std::to_string(size) + "}";
}

TEST(ImageManifest, ParsesDockerAndOciImageManifests) {
    for (const char* type_name : {kDockerManifest, kOciManifest}) {
        const std::string type = type_name;
        const std::string body =
            R"({"schemaVersion":2,"mediaType":")" + type + R"(","config":)" +
            descriptor("application/json", 'c', 10) + R"(,"layers":[)" +
            descriptor("application/vnd.oci.image.layer.v1.tar+gzip", 'a', 5) + "," +
            descriptor("application/vnd.oci.image.layer.v1.tar+zstd", 'b', 7) + "]}";
        const auto manifest = parse_manifest(body, "", "m");
        EXPECT_FALSE(manifest.is_index);
        EXPECT_EQ(manifest.config.digest, digest_of('c'));
        ASSERT_EQ(manifest.layers.size(), 2U);
        EXPECT_EQ(manifest.layers[0].digest, digest_of('a'));  // base first, as listed
        EXPECT_EQ(manifest.layers[1].size, 7);
        EXPECT_EQ(manifest.layers[1].media_type, "application/vnd.oci.image.layer.v1.tar+zstd");
    }
}

TEST(ImageManifest, SelectsTheArchitectureFromAnIndex) {
    const std::string body =
        std::string(R"({"schemaVersion":2,"mediaType":")") + kOciIndex + R"(","manifests":[)" +
        R"({"mediaType":"x","digest":")" + digest_of('1') +
        R"(","size":1,"platform":{"os":"linux","architecture":"amd64"}},)" +
        R"({"mediaType":"x","digest":")" + digest_of('2') +
        R"(","size":1,"platform":{"os":"linux","architecture":"arm64","variant":"v8"}},)" +
        R"({"mediaType":"x","digest":")" + digest_of('3') +
        R"(","size":1,"platform":{"os":"unknown","architecture":"unknown"}}]})";
    const auto index = parse_manifest(body, "", "list");
    ASSERT_TRUE(index.is_index);
    EXPECT_EQ(select_platform(index, "amd64", "list").manifest.digest, digest_of('1'));
    EXPECT_EQ(select_platform(index, "arm64", "list").manifest.digest, digest_of('2'));
    try {
        (void)select_platform(index, "ppc64le", "list");
        FAIL() << "no ppc64le entry";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("linux/amd64, linux/arm64/v8"), std::string::npos)
            << e.what();
    }
    // The Content-Type decides when the body has no mediaType.
    const auto by_header =
        parse_manifest(R"({"schemaVersion":2,"manifests":[]})",
                       std::string(kDockerManifestList) + "; charset=utf-8", "l");
    EXPECT_TRUE(by_header.is_index);
}

TEST(ImageManifest, RefusesWhatCannotBeImported) {
    const std::string layer = descriptor("application/vnd.oci.image.layer.v1.tar", 'a', 1);
    const std::string config = descriptor("application/json", 'c', 1);
    const std::string oci =
        std::string(R"({"schemaVersion":2,"mediaType":")") + kOciManifest + "\"";
    for (const std::string& body : {
             std::string("not json"),
             std::string("[1]"),
             std::string(R"({"schemaVersion":1,"name":"x","fsLayers":[]})"),
             oci + R"(,"config":)" + config + R"(,"layers":[]})",
             oci + R"(,"layers":[)" + layer + "]}",
             oci + R"(,"config":)" + config +
                 R"(,"layers":[{"mediaType":"t.tar","digest":"sha512:)" + std::string(128, 'a') +
                 R"(","size":1}]})",
             oci + R"(,"config":)" + config + R"(,"layers":[{"mediaType":"t.tar","digest":")" +
                 digest_of('A') + R"(","size":1}]})",
             oci + R"(,"config":)" + config + R"(,"layers":[{"mediaType":"t.tar","digest":")" +
                 digest_of('a') + R"(","size":-1}]})",
             oci + R"(,"config":)" + config + R"(,"layers":[)" +
                 descriptor("application/vnd.oci.image.config.v1+json", 'a', 1) + "]}",
             std::string(R"({"mediaType":"application/vnd.example+json"})"),
         }) {
        SCOPED_TRACE(body);
        EXPECT_THROW(parse_manifest(body, "", "m"), Error);
    }
}

TEST(ImageManifest, TranslatesUnameArchitectures) {
    EXPECT_EQ(normalize_architecture("x86_64"), "amd64");
    EXPECT_EQ(normalize_architecture("aarch64"), "arm64");
    EXPECT_EQ(normalize_architecture("ppc64le"), "ppc64le");
    EXPECT_EQ(normalize_architecture("arm64"), "arm64");
    EXPECT_FALSE(normalize_architecture("").empty());
}

}  // namespace
}  // namespace sqbox
