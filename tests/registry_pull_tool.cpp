// A test driver for the registry client until `sqbox import` exists: pulls or resolves a
// docker:// URI and prints what the squashfs writer would receive, as JSON on stdout.
//
//   registry_pull_tool pull|digest URI --cache DIR [--config DIR] [--docker-config FILE]
//                      [--arch ARCH] [--allow-http] [--retries N] [--stall-timeout S]
//                      [--transfer-timeout S] [--max-connections N] [--progress]
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "import/registry.h"
#include "util/errors.h"

int main(int argc, char** argv) {
    using namespace sqbox;
    if (argc < 3) {
        std::cerr << "usage: registry_pull_tool pull|digest URI [options]\n";
        return 2;
    }
    const std::string command = argv[1];
    const std::string uri = argv[2];
    RegistryOptions options;
    try {
        apply_enroot_transfer_settings(options);
        for (int i = 3; i < argc; ++i) {
            const std::string flag = argv[i];
            auto value = [&]() -> std::string {
                if (i + 1 >= argc) throw Error(flag + " needs a value");
                return argv[++i];
            };
            if (flag == "--cache")
                options.cache_dir = value();
            else if (flag == "--config")
                options.config_dir = value();
            else if (flag == "--docker-config")
                options.docker_config = value();
            else if (flag == "--arch")
                options.architecture = value();
            else if (flag == "--allow-http")
                options.allow_http = true;
            else if (flag == "--progress")
                options.progress = true;
            else if (flag == "--retries")
                options.retries = std::stoi(value());
            else if (flag == "--stall-timeout")
                options.stall_timeout = std::stol(value());
            else if (flag == "--transfer-timeout")
                options.transfer_timeout = std::stol(value());
            else if (flag == "--max-connections")
                options.max_connections = std::stoi(value());
            else
                throw Error("unknown option " + flag);
        }
        nlohmann::json out;
        if (command == "digest") {
            out["digest"] = registry_digest(uri, options);
        } else if (command == "pull") {
            const ImageLayers image = pull_from_registry(uri, options);
            out["manifest_digest"] = image.manifest_digest;
            out["config"] = image.config;
            out["layers"] = nlohmann::json::array();
            for (const auto& layer : image.layers) {
                out["layers"].push_back({{"digest", layer.digest},
                                         {"media_type", layer.media_type},
                                         {"blob", layer.blob.string()}});
            }
        } else {
            throw Error("unknown command " + command);
        }
        std::cout << out.dump() << "\n";
        return 0;
    } catch (const Error& e) {
        print_error(e.what());
        return kExitSqboxFailure;
    }
}
