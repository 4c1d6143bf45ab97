#include "image/image_source.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "util/errors.h"

namespace sqbox {
namespace {

std::string error_of(const std::string& path) {
    try {
        open_image(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

class ImageSourceTest : public ::testing::Test {
  protected:
    void SetUp() override {
        char pattern[] = "/tmp/sqbox-image-XXXXXX";
        dir_ = ::mkdtemp(pattern);
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }
    std::string write(const std::string& name, const std::string& content) {
        std::string path = dir_ + "/" + name;
        std::ofstream(path, std::ios::binary) << content;
        return path;
    }
    std::string dir_;
};

TEST_F(ImageSourceTest, AcceptsADirectory) {
    ImageSource image = open_image(dir_);
    EXPECT_EQ(image.kind, ImageSource::Kind::kDirectory);
}

TEST_F(ImageSourceTest, RejectsMissingAndNonSquashfsFiles) {
    EXPECT_NE(error_of(dir_ + "/missing.sqsh").find("No such file"), std::string::npos);
    EXPECT_NE(error_of(write("text.sqsh", std::string(8192, 'x'))).find("not a squashfs image"),
              std::string::npos);
    EXPECT_NE(error_of(write("empty.sqsh", "")).find("squashfs"), std::string::npos);
}

// A real image, built by the integration test setup, cut in half must be refused as truncated.
TEST_F(ImageSourceTest, RejectsATruncatedRealImage) {
    const char* busybox = std::getenv("SQBOX_BUSYBOX_IMAGE");
    if (busybox == nullptr) GTEST_SKIP() << "SQBOX_BUSYBOX_IMAGE not set (run through ctest)";
    std::ifstream in(busybox, std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(content.size(), 8192u);
    EXPECT_NO_THROW(open_image(busybox));
    std::string cut = write("cut.sqsh", content.substr(0, content.size() / 2));
    EXPECT_NE(error_of(cut).find("truncated"), std::string::npos) << error_of(cut);
}

}  // namespace
}  // namespace sqbox
