// llm.c token files: round trips, the exact header, and corrupt files rejected clearly.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/token_file.h"

namespace meshtrain::data::test_token_file {
namespace {

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/meshtrain_token_file_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Writes a valid file and returns its bytes, for the corruption tests to edit.
  std::string valid_bytes(const std::vector<Token>& tokens) {
    EXPECT_TRUE(write_token_file(path("valid.bin"), tokens).is_ok());
    std::ifstream f(path("valid.bin"), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }

  void write_bytes(const std::string& name, const std::string& bytes) {
    std::ofstream f(path(name), std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  // Reads NAME expecting failure; returns the message.
  std::string read_error(const std::string& name) {
    std::vector<Token> tokens = {7, 7};
    Status s = read_token_file(path(name), &tokens);
    EXPECT_FALSE(s.is_ok());
    EXPECT_TRUE(tokens.empty()) << "no partial result on error";
    EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
    return s.message();
  }

  std::string dir_;
};

void set_int(std::string* bytes, size_t index, int32_t value) {
  std::memcpy(bytes->data() + 4 * index, &value, 4);
}

TEST_F(TokenFileTest, RoundTrip) {
  std::vector<Token> tokens = {0, 1, 50256, 65535, 464, 3290};
  ASSERT_TRUE(write_token_file(path("t.bin"), tokens).is_ok());
  EXPECT_FALSE(std::filesystem::exists(path("t.bin.tmp")));
  std::vector<Token> got = {9, 9, 9, 9, 9, 9, 9, 9, 9};  // replaced, not appended to
  Status s = read_token_file(path("t.bin"), &got);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(got, tokens);
}

TEST_F(TokenFileTest, EmptyRoundTrip) {
  ASSERT_TRUE(write_token_file(path("t.bin"), {}).is_ok());
  EXPECT_EQ(std::filesystem::file_size(path("t.bin")), 1024u);
  std::vector<Token> got = {1};
  ASSERT_TRUE(read_token_file(path("t.bin"), &got).is_ok());
  EXPECT_TRUE(got.empty());
}

TEST_F(TokenFileTest, LayoutMatchesLlmC) {
  std::vector<Token> tokens = {10, 20, 30};
  std::string bytes = valid_bytes(tokens);
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  std::vector<int32_t> header(256);
  std::memcpy(header.data(), bytes.data(), 1024);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 3);
  for (size_t i = 3; i < 256; ++i) ASSERT_EQ(header[i], 0) << "header int " << i;
  std::vector<uint16_t> body(3);  // llm.c's uint16 body
  std::memcpy(body.data(), bytes.data() + 1024, 6);
  EXPECT_EQ(std::vector<Token>(body.begin(), body.end()), tokens);
}

TEST_F(TokenFileTest, BadMagic) {
  std::string bytes = valid_bytes({1, 2});
  set_int(&bytes, 0, 20240326);
  write_bytes("bad.bin", bytes);
  EXPECT_NE(read_error("bad.bin").find("magic"), std::string::npos);
}

// Ids past 16 bits: version 2, 4 bytes a token, the same header otherwise.
TEST_F(TokenFileTest, WideIdsRoundTripAsVersion2) {
  std::vector<Token> tokens = {0, 65535, 65536, 128255, 16777215};
  std::string bytes = valid_bytes(tokens);
  ASSERT_EQ(bytes.size(), 1024u + 4 * tokens.size());
  std::vector<int32_t> header(256);
  std::memcpy(header.data(), bytes.data(), 1024);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 2);
  EXPECT_EQ(header[2], 5);
  std::vector<Token> got;
  ASSERT_TRUE(read_token_file(path("valid.bin"), &got).is_ok());
  EXPECT_EQ(got, tokens);
  ASSERT_TRUE(parse_token_file(bytes, &got).is_ok());
  EXPECT_EQ(got, tokens);
}

TEST_F(TokenFileTest, BadVersion) {
  std::string bytes = valid_bytes({1, 2});
  set_int(&bytes, 1, 3);
  write_bytes("bad.bin", bytes);
  EXPECT_NE(read_error("bad.bin").find("version"), std::string::npos);
}

TEST_F(TokenFileTest, NegativeCount) {
  std::string bytes = valid_bytes({1, 2});
  set_int(&bytes, 2, -1);
  write_bytes("bad.bin", bytes);
  EXPECT_NE(read_error("bad.bin").find("negative"), std::string::npos);
}

TEST_F(TokenFileTest, TruncatedBody) {
  std::string bytes = valid_bytes({1, 2, 3});
  write_bytes("cut.bin", bytes.substr(0, bytes.size() - 1));
  EXPECT_NE(read_error("cut.bin").find("truncated"), std::string::npos);
}

TEST_F(TokenFileTest, CountLargerThanFile) {
  std::string bytes = valid_bytes({1, 2, 3});
  set_int(&bytes, 2, 4);
  write_bytes("bad.bin", bytes);
  EXPECT_NE(read_error("bad.bin").find("truncated"), std::string::npos);
}

TEST_F(TokenFileTest, TruncatedHeader) {
  std::string bytes = valid_bytes({1, 2, 3});
  for (size_t keep : {size_t{0}, size_t{3}, size_t{1023}}) {
    write_bytes("cut.bin", bytes.substr(0, keep));
    EXPECT_NE(read_error("cut.bin").find("truncated"), std::string::npos) << keep;
  }
}

TEST_F(TokenFileTest, TrailingBytes) {
  std::string bytes = valid_bytes({1, 2, 3});
  write_bytes("long.bin", bytes + std::string(2, '\0'));
  EXPECT_NE(read_error("long.bin").find("trailing"), std::string::npos);
}

TEST_F(TokenFileTest, MissingFile) { read_error("absent.bin"); }

TEST_F(TokenFileTest, WriteIntoMissingDirFails) {
  std::vector<Token> tokens = {1};
  Status s = write_token_file(path("no/such/dir/t.bin"), tokens);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("t.bin"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace meshtrain::data::test_token_file
