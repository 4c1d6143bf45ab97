#include "security/seccomp_profile.h"

#include <fcntl.h>
#include <seccomp.h>

#include <algorithm>
#include <cerrno>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "util/files.h"
#include "util/json_positions.h"

namespace sqbox {
namespace {

using nlohmann::json;

constexpr uint32_t kDefaultErrno = EPERM;  // Docker's choice when errnoRet is absent

// Walks the parsed document, checking every field, and reports problems at their source line.
class ProfileReader {
  public:
    ProfileReader(const std::string& text, const std::string& origin)
        : origin_(origin), lines_(json_value_lines(text)) {}

    [[noreturn]] void fail(const std::string& pointer, const std::string& message) const {
        std::string at = pointer;
        while (!lines_.contains(at) && !at.empty()) at.erase(at.rfind('/'));
        const int line = lines_.contains(at) ? lines_.at(at) : 1;
        throw SeccompProfileError(origin_ + ":" + std::to_string(line) + ": " + message);
    }

    // "syscalls[3].action: " for a pointer inside the document, "" for the document itself.
    static std::string prefix(const std::string& pointer) {
        return pointer.empty() ? std::string() : where(pointer) + ": ";
    }

    static std::string where(const std::string& pointer) {
        std::string path;
        size_t pos = 1;
        while (pos <= pointer.size()) {
            size_t next = pointer.find('/', pos);
            std::string part = pointer.substr(pos, next - pos);
            const bool index = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
            path += index ? "[" + part + "]" : (path.empty() ? "" : ".") + part;
            if (next == std::string::npos) break;
            pos = next + 1;
        }
        return path;
    }

    void only_fields(const json& object, const std::string& pointer,
                     std::initializer_list<const char*> allowed) const {
        if (!object.is_object()) fail(pointer, where(pointer) + ": expected an object");
        for (const auto& item : object.items()) {
            const std::string& key = item.key();
            if (std::none_of(allowed.begin(), allowed.end(),
                             [&key](const char* name) { return key == name; })) {
                fail(pointer + "/" + key, prefix(pointer) + "unknown field '" + key + "'");
            }
        }
    }

    std::string string_at(const json& value, const std::string& pointer) const {
        if (!value.is_string()) fail(pointer, where(pointer) + ": expected a string");
        return value.get<std::string>();
    }

    uint64_t unsigned_at(const json& value, const std::string& pointer) const {
        if (!value.is_number_unsigned()) {
            fail(pointer, where(pointer) + ": expected a non-negative integer");
        }
        return value.get<uint64_t>();
    }

    std::vector<std::string> strings_at(const json& value, const std::string& pointer,
                                        std::vector<int>* lines = nullptr) const {
        if (value.is_null()) return {};
        if (!value.is_array()) fail(pointer, where(pointer) + ": expected a list of strings");
        std::vector<std::string> out;
        for (size_t i = 0; i < value.size(); ++i) {
            const std::string item = pointer + "/" + std::to_string(i);
            out.push_back(string_at(value[i], item));
            if (lines != nullptr) lines->push_back(line_of(item));
        }
        return out;
    }

    int line_of(const std::string& pointer) const {
        return lines_.contains(pointer) ? lines_.at(pointer) : 0;
    }

    SeccompAction action_at(const json& object, const std::string& action_key,
                            const std::string& errno_key, const std::string& pointer) const {
        const std::string action_pointer = pointer + "/" + action_key;
        if (!object.contains(action_key)) fail(pointer, prefix(pointer) + "missing " + action_key);
        SeccompAction action;
        action.name = string_at(object.at(action_key), action_pointer);
        std::optional<uint32_t> errno_value;
        if (object.contains(errno_key) && !object.at(errno_key).is_null()) {
            const std::string errno_pointer = pointer + "/" + errno_key;
            uint64_t value = unsigned_at(object.at(errno_key), errno_pointer);
            if (value > 0xffff) fail(errno_pointer, where(errno_pointer) + ": out of range");
            errno_value = static_cast<uint32_t>(value);
        }
        const std::string& name = action.name;
        const bool takes_errno = name == "SCMP_ACT_ERRNO" || name == "SCMP_ACT_TRACE";
        if (errno_value && !takes_errno) {
            fail(pointer + "/" + errno_key, prefix(pointer) + errno_key +
                                                " is only valid with SCMP_ACT_ERRNO or " +
                                                "SCMP_ACT_TRACE");
        }
        if (name == "SCMP_ACT_ALLOW") {
            action.libseccomp_action = SCMP_ACT_ALLOW;
        } else if (name == "SCMP_ACT_ERRNO") {
            action.libseccomp_action = SCMP_ACT_ERRNO(errno_value.value_or(kDefaultErrno));
        } else if (name == "SCMP_ACT_TRACE") {
            action.libseccomp_action = SCMP_ACT_TRACE(errno_value.value_or(kDefaultErrno));
        } else if (name == "SCMP_ACT_KILL" || name == "SCMP_ACT_KILL_THREAD") {
            action.libseccomp_action = SCMP_ACT_KILL_THREAD;
        } else if (name == "SCMP_ACT_KILL_PROCESS") {
            action.libseccomp_action = SCMP_ACT_KILL_PROCESS;
        } else if (name == "SCMP_ACT_TRAP") {
            action.libseccomp_action = SCMP_ACT_TRAP;
        } else if (name == "SCMP_ACT_LOG") {
            action.libseccomp_action = SCMP_ACT_LOG;
        } else if (name == "SCMP_ACT_NOTIFY") {
            fail(action_pointer, where(action_pointer) +
                                     ": SCMP_ACT_NOTIFY is not supported (it needs a listener "
                                     "process outside the sandbox)");
        } else {
            fail(action_pointer, where(action_pointer) + ": unknown action '" + name + "'");
        }
        return action;
    }

    std::string architecture_at(const json& value, const std::string& pointer) const {
        std::string name = string_at(value, pointer);
        std::string libseccomp_name = name;
        if (libseccomp_name.starts_with("SCMP_ARCH_")) libseccomp_name.erase(0, 10);
        std::transform(libseccomp_name.begin(), libseccomp_name.end(), libseccomp_name.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        if (::seccomp_arch_resolve_name(libseccomp_name.c_str()) == 0) {
            fail(pointer, where(pointer) + ": unknown architecture '" + name + "'");
        }
        return libseccomp_name;
    }

    SeccompRuleFilter rule_filter_at(const json& value, const std::string& pointer) const {
        SeccompRuleFilter filter;
        if (value.is_null()) return filter;
        only_fields(value, pointer, {"caps", "arches", "minKernel"});
        if (value.contains("caps")) filter.caps = strings_at(value.at("caps"), pointer + "/caps");
        if (value.contains("arches")) {
            filter.arches = strings_at(value.at("arches"), pointer + "/arches");
        }
        if (value.contains("minKernel") && !value.at("minKernel").is_null()) {
            const std::string kernel_pointer = pointer + "/minKernel";
            std::string version = string_at(value.at("minKernel"), kernel_pointer);
            unsigned major = 0;
            unsigned minor = 0;
            if (std::sscanf(version.c_str(), "%u.%u", &major, &minor) != 2) {
                fail(kernel_pointer,
                     where(kernel_pointer) + ": expected MAJOR.MINOR, got '" + version + "'");
            }
            filter.min_kernel = version;
        }
        return filter;
    }

    SeccompArgCondition condition_at(const json& value, const std::string& pointer) const {
        only_fields(value, pointer, {"index", "value", "valueTwo", "op"});
        SeccompArgCondition condition;
        if (!value.contains("index")) fail(pointer, where(pointer) + ": missing index");
        uint64_t index = unsigned_at(value.at("index"), pointer + "/index");
        if (index > 5) fail(pointer + "/index", where(pointer) + ": index must be 0 to 5");
        condition.index = static_cast<unsigned>(index);
        if (value.contains("value")) {
            condition.value = unsigned_at(value.at("value"), pointer + "/value");
        }
        if (value.contains("valueTwo")) {
            condition.value_two = unsigned_at(value.at("valueTwo"), pointer + "/valueTwo");
        }
        if (!value.contains("op")) fail(pointer, where(pointer) + ": missing op");
        static const std::unordered_map<std::string, int> kOps = {
            {"SCMP_CMP_NE", SCMP_CMP_NE},
            {"SCMP_CMP_LT", SCMP_CMP_LT},
            {"SCMP_CMP_LE", SCMP_CMP_LE},
            {"SCMP_CMP_EQ", SCMP_CMP_EQ},
            {"SCMP_CMP_GE", SCMP_CMP_GE},
            {"SCMP_CMP_GT", SCMP_CMP_GT},
            {"SCMP_CMP_MASKED_EQ", SCMP_CMP_MASKED_EQ},
        };
        std::string op = string_at(value.at("op"), pointer + "/op");
        auto found = kOps.find(op);
        if (found == kOps.end()) {
            fail(pointer + "/op", where(pointer) + ": unknown op '" + op + "'");
        }
        condition.op = found->second;
        return condition;
    }

    SeccompRule rule_at(const json& value, const std::string& pointer) const {
        only_fields(
            value, pointer,
            {"name", "names", "action", "errnoRet", "args", "comment", "includes", "excludes"});
        SeccompRule rule;
        rule.line = line_of(pointer);
        if (value.contains("name") && !value.at("name").is_null()) {
            rule.names.push_back(string_at(value.at("name"), pointer + "/name"));
            rule.name_lines.push_back(line_of(pointer + "/name"));
        }
        if (value.contains("names")) {
            std::vector<std::string> names =
                strings_at(value.at("names"), pointer + "/names", &rule.name_lines);
            rule.names.insert(rule.names.end(), names.begin(), names.end());
        }
        if (rule.names.empty()) fail(pointer, where(pointer) + ": no syscall names");
        rule.action = action_at(value, "action", "errnoRet", pointer);
        if (value.contains("args") && !value.at("args").is_null()) {
            const json& args = value.at("args");
            if (!args.is_array()) {
                fail(pointer + "/args", where(pointer) + ".args: expected a list");
            }
            for (size_t i = 0; i < args.size(); ++i) {
                rule.args.push_back(condition_at(args[i], pointer + "/args/" + std::to_string(i)));
            }
        }
        if (value.contains("includes")) {
            rule.includes = rule_filter_at(value.at("includes"), pointer + "/includes");
        }
        if (value.contains("excludes")) {
            rule.excludes = rule_filter_at(value.at("excludes"), pointer + "/excludes");
        }
        return rule;
    }

    SeccompProfile profile(const json& document) const {
        only_fields(document, "",
                    {"defaultAction", "defaultErrnoRet", "architectures", "archMap", "syscalls",
                     "flags", "comment", "listenerPath", "listenerMetadata"});
        SeccompProfile profile;
        profile.origin = origin_;
        profile.default_action = action_at(document, "defaultAction", "defaultErrnoRet", "");
        if (document.contains("listenerPath") && !document.at("listenerPath").is_null() &&
            !string_at(document.at("listenerPath"), "/listenerPath").empty()) {
            fail("/listenerPath", "listenerPath is not supported (no SCMP_ACT_NOTIFY)");
        }
        if (document.contains("architectures")) {
            const json& list = document.at("architectures");
            if (!list.is_null() && !list.is_array()) {
                fail("/architectures", "architectures: expected a list");
            }
            for (size_t i = 0; !list.is_null() && i < list.size(); ++i) {
                profile.architectures.push_back(
                    architecture_at(list[i], "/architectures/" + std::to_string(i)));
            }
        }
        if (document.contains("archMap") && !document.at("archMap").is_null()) {
            const json& map = document.at("archMap");
            if (!map.is_array()) fail("/archMap", "archMap: expected a list");
            for (size_t i = 0; i < map.size(); ++i) {
                const std::string pointer = "/archMap/" + std::to_string(i);
                only_fields(map[i], pointer, {"architecture", "subArchitectures"});
                SeccompArchMapping mapping;
                if (!map[i].contains("architecture")) {
                    fail(pointer, where(pointer) + ": missing architecture");
                }
                mapping.architecture =
                    architecture_at(map[i].at("architecture"), pointer + "/architecture");
                if (map[i].contains("subArchitectures") &&
                    !map[i].at("subArchitectures").is_null()) {
                    const json& subs = map[i].at("subArchitectures");
                    if (!subs.is_array()) {
                        fail(pointer + "/subArchitectures",
                             where(pointer) + ".subArchitectures: expected a list");
                    }
                    for (size_t j = 0; j < subs.size(); ++j) {
                        mapping.sub_architectures.push_back(architecture_at(
                            subs[j], pointer + "/subArchitectures/" + std::to_string(j)));
                    }
                }
                profile.arch_map.push_back(std::move(mapping));
            }
        }
        if (document.contains("flags")) {
            profile.flags = strings_at(document.at("flags"), "/flags");
            for (size_t i = 0; i < profile.flags.size(); ++i) {
                const std::string& flag = profile.flags[i];
                if (flag != "SECCOMP_FILTER_FLAG_LOG" && flag != "SECCOMP_FILTER_FLAG_SPEC_ALLOW") {
                    fail("/flags/" + std::to_string(i), "flags: unsupported flag '" + flag + "'");
                }
            }
        }
        if (document.contains("syscalls") && !document.at("syscalls").is_null()) {
            const json& syscalls = document.at("syscalls");
            if (!syscalls.is_array()) fail("/syscalls", "syscalls: expected a list");
            for (size_t i = 0; i < syscalls.size(); ++i) {
                profile.rules.push_back(rule_at(syscalls[i], "/syscalls/" + std::to_string(i)));
            }
        }
        return profile;
    }

  private:
    const std::string& origin_;
    std::unordered_map<std::string, int> lines_;
};

}  // namespace

SeccompProfile parse_seccomp_profile(const std::string& text, const std::string& origin) {
    json document;
    try {
        document = json::parse(text);
    } catch (const json::parse_error& e) {
        std::string message = e.what();
        // "[json.exception.parse_error.101] parse error at line 3, column 5: ..." -> the reason.
        size_t reason = message.find(": ");
        if (reason != std::string::npos) message = message.substr(reason + 2);
        throw SeccompProfileError(origin + ":" + std::to_string(line_of_offset(text, e.byte)) +
                                  ": not valid JSON: " + message);
    }
    return ProfileReader(text, origin).profile(document);
}

SeccompProfile load_seccomp_profile_file(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw system_error("seccomp profile " + path);
    return parse_seccomp_profile(read_all(fd.get(), "seccomp profile " + path), path);
}

}  // namespace sqbox
