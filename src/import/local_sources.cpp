#include "import/local_sources.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <system_error>
#include <vector>

#include "import/image_import.h"
#include "import/layer_reader.h"
#include "import/sha256.h"
#include "util/errors.h"
#include "util/files.h"
#include "util/unique_fd.h"

namespace sqbox {
namespace {

constexpr size_t kMaxJsonBytes = size_t{16} << 20;
constexpr size_t kCopyBlockBytes = 256 * 1024;
constexpr int kMaxAliasHops = 8;

const std::vector<std::string> kLayerMediaTypes = {
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
};
const std::vector<std::string> kIndexMediaTypes = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
};

bool contains(const std::vector<std::string>& list, const std::string& value) {
    return std::find(list.begin(), list.end(), value) != list.end();
}

bool starts_with(const std::string& text, const std::string& prefix) {
    return text.compare(0, prefix.size(), prefix) == 0;
}

// A blob: its file and the sha256 of its content.
struct Blob {
    std::filesystem::path file;
    std::string digest;
};

// Where blobs come from: a layout directory on disk or the members copied out of an archive.
class BlobStore {
  public:
    virtual ~BlobStore() = default;
    // The blob of a name inside the layout ("index.json", "blobs/sha256/HEX"), or nullopt.
    virtual std::optional<Blob> find(const std::string& name) = 0;

    // The blob a descriptor's digest names, verified.
    Blob blob(const std::string& digest, const std::string& what) {
        if (!is_sha256_digest(digest)) throw Error(what + ": unsupported digest '" + digest + "'");
        std::optional<Blob> found = find("blobs/sha256/" + digest.substr(7));
        if (!found) throw Error(what + ": blob " + digest + " is missing");
        check_digest(digest, found->digest, what + " (blob " + digest + ")");
        return *found;
    }
};

nlohmann::json read_json(const std::filesystem::path& file, const std::string& what) {
    UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
    if (!fd) throw system_error("cannot open " + what);
    const std::string text = read_bounded_regular_file(fd.get(), kMaxJsonBytes, what);
    nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
    if (json.is_discarded()) throw Error(what + ": not valid JSON");
    return json;
}

std::string string_member(const nlohmann::json& object, const char* name) {
    if (!object.is_object()) return {};
    auto found = object.find(name);
    return found != object.end() && found->is_string() ? found->get<std::string>() : std::string();
}

// OCI layout directory.
class DirectoryStore : public BlobStore {
  public:
    explicit DirectoryStore(std::filesystem::path directory) : directory_(std::move(directory)) {}
    std::optional<Blob> find(const std::string& name) override {
        std::filesystem::path file = directory_ / name;
        // O_NONBLOCK: a FIFO in the layout must not hang the import (it is refused below).
        UniqueFd fd(::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
        if (!fd) {
            if (errno == ENOENT) return std::nullopt;
            throw system_error("cannot open " + file.string());
        }
        struct stat st {};
        if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
            throw Error(file.string() + " is not a regular file");
        }
        return Blob{file, sha256_of_fd(fd.get(), file.string())};
    }

  private:
    std::filesystem::path directory_;
};

// Components of a member name, ".." stopping at the top: only ever a key, never a path used.
std::string normal_member_name(const std::string& name) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (start <= name.size()) {
        size_t end = name.find('/', start);
        if (end == std::string::npos) end = name.size();
        std::string part = name.substr(start, end - start);
        if (part == "..") {
            if (!parts.empty()) parts.pop_back();
        } else if (!part.empty() && part != ".") {
            parts.push_back(std::move(part));
        }
        start = end + 1;
    }
    std::string joined;
    for (const std::string& part : parts) joined += (joined.empty() ? "" : "/") + part;
    return joined;
}

// The regular files of a tar archive, copied to numbered files of a scratch directory (names
// from the archive are keys, never paths), each with its digest; symlinks as aliases.
class ArchiveStore : public BlobStore {
  public:
    // Reads the archive from `fd` (a file, or a stream when `is_stream`); `what` names it in
    // messages.
    ArchiveStore(int fd, bool is_stream, const std::filesystem::path& scratch,
                 const std::string& what);
    std::optional<Blob> find(const std::string& name) override {
        std::string key = normal_member_name(name);
        for (int hop = 0; hop <= kMaxAliasHops; ++hop) {
            if (auto found = members_.find(key); found != members_.end()) return found->second;
            auto alias = aliases_.find(key);
            if (alias == aliases_.end()) return std::nullopt;
            key = alias->second;
        }
        return std::nullopt;
    }

  private:
    std::map<std::string, Blob> members_;
    std::map<std::string, std::string> aliases_;
};

ArchiveStore::ArchiveStore(int fd, bool is_stream, const std::filesystem::path& scratch,
                           const std::string& what) {
    struct archive* reader = archive_read_new();
    if (reader == nullptr) throw Error(what + ": out of memory");
    std::unique_ptr<struct archive, int (*)(struct archive*)> owner(reader, archive_read_free);
    if (archive_read_support_filter_gzip(reader) != ARCHIVE_OK ||
        archive_read_support_filter_zstd(reader) != ARCHIVE_OK ||
        archive_read_support_format_tar(reader) != ARCHIVE_OK ||
        archive_read_open_fd(reader, fd, kCopyBlockBytes) != ARCHIVE_OK) {
        const char* message = archive_error_string(reader);
        throw Error(what + ": " + (message != nullptr ? message : "not a tar archive"));
    }
    // A compressed archive may expand only as far as a layer may (layer_reader.h): a small
    // archive must not fill the disk beside the output before anything is checked. A stream's
    // size is not known ahead: what it expanded to so far is held against what was read so far.
    uint64_t archive_size = 0;
    if (!is_stream) {
        struct stat archive_stat {};
        if (::fstat(fd, &archive_stat) != 0) throw system_error("cannot stat " + what);
        archive_size = static_cast<uint64_t>(archive_stat.st_size);
    }
    auto budget = [&] {
        const uint64_t read_so_far =
            is_stream
                ? static_cast<uint64_t>(std::max<la_int64_t>(0, archive_filter_bytes(reader, -1)))
                : archive_size;
        return std::max<uint64_t>(read_so_far, kCopyBlockBytes) * kMaxExpansionRatio;
    };
    uint64_t copied = 0;
    std::vector<char> buffer(kCopyBlockBytes);
    for (size_t number = 0;; ++number) {
        struct archive_entry* entry = nullptr;
        const int status = archive_read_next_header(reader, &entry);
        if (status == ARCHIVE_EOF) break;
        if (status != ARCHIVE_OK && status != ARCHIVE_WARN) {
            throw Error(what + ": " + archive_error_string(reader));
        }
        const char* raw_name = archive_entry_pathname(entry);
        if (raw_name == nullptr) continue;
        const std::string name = normal_member_name(raw_name);
        const mode_t type = archive_entry_filetype(entry);
        if (type == AE_IFLNK) {
            const char* target = archive_entry_symlink(entry);
            if (target == nullptr) continue;
            const std::string base = name.find('/') == std::string::npos
                                         ? std::string()
                                         : name.substr(0, name.rfind('/') + 1);
            aliases_[name] = normal_member_name(target[0] == '/' ? target : base + target);
            continue;
        }
        if (const char* link = archive_entry_hardlink(entry); link != nullptr) {
            aliases_[name] = normal_member_name(link);
            continue;
        }
        if (type != AE_IFREG) continue;
        const std::filesystem::path file = scratch / ("member-" + std::to_string(number));
        UniqueFd out(::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
        if (!out) throw system_error("cannot create " + file.string());
        Sha256 hash;
        for (;;) {
            const la_ssize_t count = archive_read_data(reader, buffer.data(), buffer.size());
            if (count < 0) throw Error(what + ": " + name + ": " + archive_error_string(reader));
            if (count == 0) break;
            copied += static_cast<uint64_t>(count);
            if (copied > budget()) {
                throw Error(what + ": decompresses to more than " +
                            std::to_string(kMaxExpansionRatio) + " times its size; refused");
            }
            hash.update(buffer.data(), static_cast<size_t>(count));
            if (!write_all(out.get(), buffer.data(), static_cast<size_t>(count))) {
                throw system_error("cannot write " + file.string());
            }
        }
        members_[name] = Blob{file, hash.digest()};
    }
}

// Picks one manifest descriptor of an index: by REF, then by architecture; nested indexes are
// followed.
nlohmann::json pick_manifest(BlobStore& store, const nlohmann::json& index, const std::string& ref,
                             const std::string& architecture, const std::string& what,
                             int depth = 0) {
    if (depth > 4) throw Error(what + ": indexes nested too deeply");
    if (!index.is_object() || !index.contains("manifests") || !index["manifests"].is_array()) {
        throw Error(what + ": no manifests in the index");
    }
    std::vector<nlohmann::json> candidates;
    for (const nlohmann::json& descriptor : index["manifests"]) {
        if (!ref.empty()) {
            const nlohmann::json& annotations = descriptor.value("annotations", nlohmann::json());
            if (string_member(annotations, "org.opencontainers.image.ref.name") != ref) continue;
        }
        const nlohmann::json& platform = descriptor.value("platform", nlohmann::json());
        const std::string arch = string_member(platform, "architecture");
        if (!arch.empty() && arch != architecture) continue;
        candidates.push_back(descriptor);
    }
    if (candidates.empty()) {
        throw Error(what + ": no image " + (ref.empty() ? "" : "named '" + ref + "' ") + "for " +
                    architecture);
    }
    if (candidates.size() > 1) {
        throw Error(what + ": several images; name one with :REF");
    }
    nlohmann::json descriptor = candidates.front();
    if (contains(kIndexMediaTypes, string_member(descriptor, "mediaType"))) {
        const Blob blob = store.blob(string_member(descriptor, "digest"), what);
        return pick_manifest(store, read_json(blob.file, what + " (index)"), "", architecture, what,
                             depth + 1);
    }
    return descriptor;
}

ImageLayers load_oci_layout(BlobStore& store, const std::string& ref,
                            const std::string& architecture, const std::string& what) {
    std::optional<Blob> index_blob = store.find("index.json");
    if (!index_blob) throw Error(what + ": not an OCI image layout (no index.json)");
    const nlohmann::json index = read_json(index_blob->file, what + " (index.json)");
    const nlohmann::json descriptor = pick_manifest(store, index, ref, architecture, what);
    ImageLayers image;
    image.manifest_digest = string_member(descriptor, "digest");
    const Blob manifest_blob = store.blob(image.manifest_digest, what + " (manifest)");
    const nlohmann::json manifest = read_json(manifest_blob.file, what + " (manifest)");
    const nlohmann::json& config = manifest.value("config", nlohmann::json());
    const Blob config_blob = store.blob(string_member(config, "digest"), what + " (config)");
    image.config = read_json(config_blob.file, what + " (config)");
    if (!manifest.contains("layers") || !manifest["layers"].is_array()) {
        throw Error(what + ": the manifest lists no layers");
    }
    for (const nlohmann::json& layer : manifest["layers"]) {
        ImageLayer entry;
        entry.digest = string_member(layer, "digest");
        entry.media_type = string_member(layer, "mediaType");
        if (!contains(kLayerMediaTypes, entry.media_type)) {
            throw Error(what + ": layer " + entry.digest + " has unsupported media type '" +
                        entry.media_type + "'");
        }
        entry.blob = store.blob(entry.digest, what + " (layer)").file;
        image.layers.push_back(std::move(entry));
    }
    return image;
}

// Names like "<hex>.json" or "blobs/sha256/<hex>" carry the digest of what they hold.
std::string named_digest(const std::string& name) {
    std::string base = name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
    if (base.size() > 5 && base.compare(base.size() - 5, 5, ".json") == 0) {
        base.resize(base.size() - 5);
    }
    const std::string digest = "sha256:" + base;
    return is_sha256_digest(digest) ? digest : std::string();
}

// The entry of manifest.json whose configuration is `image_id` (a daemon's image ID), or the only
// entry; nullptr when neither (a daemon whose IDs are manifest digests sends one image anyway).
const nlohmann::json* entry_of_image_id(const nlohmann::json& manifest,
                                        const std::string& image_id) {
    for (const nlohmann::json& entry : manifest) {
        if (named_digest(string_member(entry, "Config")) == image_id) return &entry;
    }
    return manifest.size() == 1 ? &manifest.front() : nullptr;
}

// `docker save`'s manifest.json, or nullopt when the archive has none. `image_id`, when set,
// picks the image instead of `ref`.
std::optional<ImageLayers> load_docker_manifest(BlobStore& store, const std::string& ref,
                                                const std::string& what,
                                                const std::string& image_id = {}) {
    std::optional<Blob> manifest_blob = store.find("manifest.json");
    if (!manifest_blob) return std::nullopt;
    const nlohmann::json manifest = read_json(manifest_blob->file, what + " (manifest.json)");
    if (!manifest.is_array() || manifest.empty()) throw Error(what + ": empty manifest.json");
    const nlohmann::json* chosen = nullptr;
    if (!image_id.empty()) {
        chosen = entry_of_image_id(manifest, image_id);
        if (chosen == nullptr) throw Error(what + ": no image " + image_id + " in the archive");
    }
    for (const nlohmann::json& entry : manifest) {
        if (!image_id.empty()) break;
        bool match = ref.empty();
        if (!ref.empty() && entry.contains("RepoTags") && entry["RepoTags"].is_array()) {
            for (const nlohmann::json& tag : entry["RepoTags"]) match = match || tag == ref;
        }
        if (!match) continue;
        if (chosen != nullptr) throw Error(what + ": several images; name one with :REF");
        chosen = &entry;
    }
    if (chosen == nullptr) throw Error(what + ": no image named '" + ref + "'");

    const std::string config_name = string_member(*chosen, "Config");
    std::optional<Blob> config_blob = store.find(config_name);
    if (!config_blob) throw Error(what + ": the image's configuration is missing");
    const std::string config_digest = named_digest(config_name);
    if (config_digest.empty()) throw Error(what + ": cannot tell the configuration's digest");
    check_digest(config_digest, config_blob->digest, what + " (config)");
    ImageLayers image;
    image.config = read_json(config_blob->file, what + " (config)");
    image.manifest_digest = config_digest;
    const nlohmann::json& rootfs = image.config.value("rootfs", nlohmann::json());
    const nlohmann::json diff_ids =
        rootfs.is_object() ? rootfs.value("diff_ids", nlohmann::json()) : nlohmann::json();
    const nlohmann::json layers = chosen->value("Layers", nlohmann::json::array());
    if (!layers.is_array() || !diff_ids.is_array() || diff_ids.size() != layers.size()) {
        throw Error(what + ": the layers do not match the configuration's diff_ids");
    }
    for (size_t i = 0; i < layers.size(); ++i) {
        const std::string name = layers[i].is_string() ? layers[i].get<std::string>() : "";
        std::optional<Blob> blob = store.find(name);
        if (!blob) throw Error(what + ": layer '" + name + "' is missing");
        const std::string diff_id = diff_ids[i].is_string() ? diff_ids[i].get<std::string>() : "";
        // Uncompressed layers are their diff_id; others must be named by their digest.
        if (blob->digest != diff_id)
            check_digest(named_digest(name), blob->digest, what + " (layer " + name + ")");
        image.layers.push_back(
            {blob->file, "application/vnd.docker.image.rootfs.diff.tar", blob->digest});
    }
    return image;
}

struct ParsedUri {
    std::string scheme;  // "oci", "oci-archive", "docker-archive"
    std::filesystem::path path;
    std::string ref;
};

ParsedUri parse_local_uri(const std::string& uri) {
    ParsedUri parsed;
    std::string rest;
    for (const char* scheme : {"oci-archive", "docker-archive", "oci"}) {
        const std::string prefix = std::string(scheme) + ":";
        if (starts_with(uri, prefix)) {
            parsed.scheme = scheme;
            rest = uri.substr(prefix.size());
            break;
        }
    }
    if (parsed.scheme.empty()) {
        parsed.scheme = "oci";
        rest = uri;
    }
    // PATH[:REF]: the last colon starts REF when PATH itself exists without it.
    const size_t colon = rest.rfind(':');
    if (colon != std::string::npos && colon > 0 && rest.find('/', colon) == std::string::npos &&
        ::access(rest.substr(0, colon).c_str(), F_OK) == 0 && ::access(rest.c_str(), F_OK) != 0) {
        parsed.ref = rest.substr(colon + 1);
        rest.resize(colon);
    }
    parsed.path = rest;
    if (parsed.path.empty()) throw Error("no path in image URI '" + uri + "'");
    return parsed;
}

}  // namespace

LocalImage::~LocalImage() {
    if (scratch.empty()) return;
    std::error_code ignored;  // best effort: nobody is left to report to
    std::filesystem::remove_all(scratch, ignored);
}

bool is_local_image_uri(const std::string& uri) {
    if (starts_with(uri, "oci:") || starts_with(uri, "oci-archive:") ||
        starts_with(uri, "docker-archive:")) {
        return true;
    }
    if (uri.find("://") != std::string::npos) return false;
    struct stat st {};
    return ::stat(uri.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string host_go_architecture() {
    struct utsname name {};
    if (::uname(&name) != 0) throw system_error("uname");
    return go_architecture(name.machine);
}

std::string go_architecture(const std::string& name) {
    if (name == "x86_64" || name == "amd64") return "amd64";
    if (name == "aarch64" || name == "arm64") return "arm64";
    if (name == "ppc64le") return "ppc64le";
    if (name == "s390x" || name == "riscv64" || name == "386" || name == "arm") return name;
    throw Error("unsupported architecture: " + name);
}

std::unique_ptr<LocalImage> open_local_image(const std::string& uri,
                                             const LocalSourceOptions& options) {
    const ParsedUri parsed = parse_local_uri(uri);
    const std::string architecture = options.architecture.empty()
                                         ? host_go_architecture()
                                         : go_architecture(options.architecture);
    const std::string what = parsed.path.string();
    struct stat st {};
    if (::stat(parsed.path.c_str(), &st) != 0) throw system_error("cannot open " + what);
    auto local = std::make_unique<LocalImage>();
    if (parsed.scheme == "oci") {
        if (!S_ISDIR(st.st_mode)) throw Error(what + ": not a directory (an OCI image layout)");
        DirectoryStore store(parsed.path);
        local->image = load_oci_layout(store, parsed.ref, architecture, what);
        return local;
    }
    if (!S_ISREG(st.st_mode)) throw Error(what + ": not an archive file");
    std::filesystem::path scratch = temporary_path_beside(
        options.scratch_directory.empty() ? std::filesystem::temp_directory_path() / "x"
                                          : options.scratch_directory / "x");
    if (::mkdir(scratch.c_str(), 0700) != 0) {
        throw system_error("cannot create the scratch directory " + scratch.string());
    }
    local->scratch = scratch;
    UniqueFd archive_fd(::open(parsed.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
    if (!archive_fd) throw system_error("cannot open " + what);
    ArchiveStore store(archive_fd.get(), false, scratch, what);
    if (parsed.scheme == "docker-archive") {
        std::optional<ImageLayers> image = load_docker_manifest(store, parsed.ref, what);
        local->image =
            image ? std::move(*image) : load_oci_layout(store, parsed.ref, architecture, what);
    } else {
        local->image = load_oci_layout(store, parsed.ref, architecture, what);
    }
    return local;
}

void load_docker_archive_stream(LocalImage& local, int fd, const std::string& image_id,
                                const std::string& what) {
    const std::string architecture = host_go_architecture();
    ArchiveStore store(fd, true, local.scratch, what);
    std::optional<ImageLayers> image = load_docker_manifest(store, "", what, image_id);
    local.image = image ? std::move(*image) : load_oci_layout(store, "", architecture, what);
}

}  // namespace sqbox
