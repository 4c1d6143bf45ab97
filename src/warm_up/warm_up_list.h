// An image's learned warm-up list: the names in a squashfs image that earlier runs looked up and
// the files they read, in the order they first did so.
//
// A fresh sandbox's FUSE mount starts with nothing cached, so each name the payload looks up and
// each file it starts reading costs a round trip through the image server while the payload
// waits. With a list, the supervisor looks those names up and starts those reads itself while
// the sandbox is still being set up (warm_up/look_ahead.h), and the payload finds them cached.
//
// Lists are only ever written by `sqbox run --learn-warm-up`, which the caller runs on purpose
// with a command they trust (python3 -c 'import numpy', say), or carried by the image itself
// (warm_up/list_store.h). A plain run never writes one: a list learned from a hostile payload
// would let one sandbox leave marks (which names are cached, which files are unpacked:
// warm_up/unpacked_files.h) that the next could tell.
//
// This file is the list's format; warm_up/list_store.h keeps one list per image. The format: the
// line
// "sqbox-warm-up 1\n", then one record per name: its kind ('L' looked up, 'R' a file read, 'D' a
// directory listed), the absolute path, a NUL byte. Names in an image may hold any byte but '/'
// and NUL.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sqbox {

// What a run did with a name (as well as looking it up).
enum class WarmUpKind : char { kLookUp = 'L', kRead = 'R', kList = 'D' };

struct WarmUpName {
    std::string path;  // absolute, inside the image
    WarmUpKind kind = WarmUpKind::kLookUp;

    bool operator==(const WarmUpName&) const = default;
};

// Bounds on one list, so that the warm-up stays a short head start.
inline constexpr size_t kMaxWarmUpNames = 4096;
// What a learning run's record file holds at most (warm_up/learning_recorder.h stops there; the
// image server cannot write past it, RLIMIT_FSIZE).
inline constexpr size_t kMaxLearningRecordBytes = size_t{16} << 20;
inline constexpr size_t kMaxWarmUpPathBytes = 4096;

// One record, as the image server appends them while it learns.
std::string encode_warm_up_record(const WarmUpName& name);

// The records in `data`, in order, stopping at a record that is cut short (the server may have
// been killed while writing one). Invalid records (a relative path, a "." or ".." or empty
// component, an overlong path, an unknown kind) are skipped. "/" itself is a valid path.
std::vector<WarmUpName> decode_warm_up_records(std::string_view data);

// A whole list file: the header line, then the records.
std::string encode_warm_up_list(const std::vector<WarmUpName>& names);

// nullopt if `data` is not a list file (no header, or a cut-short record). Each path once (with
// the strongest kind it was given), at most kMaxWarmUpNames of them.
std::optional<std::vector<WarmUpName>> decode_warm_up_list(std::string_view data);

// `known`, then the names of `learned` that are new (in their order); a name only looked up in
// one and read or listed in the other is read or listed in the result. At most kMaxWarmUpNames
// names.
std::vector<WarmUpName> merge_warm_up_names(std::vector<WarmUpName> known,
                                            const std::vector<WarmUpName>& learned);

}  // namespace sqbox
