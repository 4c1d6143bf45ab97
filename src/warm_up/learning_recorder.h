// A learning run's record (sqbox run --learn-warm-up): the image server appends a record of the
// warm-up list's format (warm_up/warm_up_list.h) for each name looked up, found or not, for the
// first read of each file and for the first listing of each directory, to a memory file the
// launcher reads when the sandbox is gone. Records are written as they happen, so a server
// killed at any point leaves whole records and at most one cut short, which is dropped.
#pragma once

#include <cstddef>
#include <string>

#include "image/squashfs_server.h"
#include "warm_up/warm_up_list.h"

namespace sqbox {

class LearningRecorder final : public ImageAccessRecorder {
  public:
    // `fd`: the record file, which the caller keeps open while this object is used.
    explicit LearningRecorder(int fd) : fd_(fd) {}

    void looked_up(const std::string& path) override { record({path, WarmUpKind::kLookUp}); }
    void first_read(const std::string& path) override { record({path, WarmUpKind::kRead}); }
    void first_listed(const std::string& path) override { record({path, WarmUpKind::kList}); }

  private:
    void record(const WarmUpName& name);

    // What one run records: a list keeps kMaxWarmUpNames names at most anyway.
    static constexpr size_t kMaxRecords = 4 * kMaxWarmUpNames;
    static constexpr size_t kMaxRecordBytes = kMaxLearningRecordBytes;

    int fd_;
    size_t records_ = 0;
    size_t bytes_ = 0;
};

}  // namespace sqbox
