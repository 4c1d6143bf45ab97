#include "warm_up/learning_recorder.h"

#include "util/files.h"

namespace sqbox {

void LearningRecorder::record(const WarmUpName& name) {
    // Paths a list would not keep are not written at all: a deep tree of long names could
    // otherwise fill the memory file far beyond what a list holds.
    if (name.path.empty() || name.path.size() > kMaxWarmUpPathBytes || records_ >= kMaxRecords ||
        bytes_ + name.path.size() > kMaxRecordBytes) {
        return;
    }
    ++records_;
    bytes_ += name.path.size();
    const std::string bytes = encode_warm_up_record(name);
    // A failed write (the memory file hit the caller's limits) ends the record: a later record
    // after a lost one would be misread.
    if (!write_all(fd_, bytes.data(), bytes.size())) records_ = kMaxRecords;
}

}  // namespace sqbox
