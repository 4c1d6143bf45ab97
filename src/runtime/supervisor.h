// The sandbox's supervisor: root of a new user namespace, owner of the image mount. Its steps, in
// the order runtime/pipeline.cpp calls them.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "image/image_source.h"
#include "image/squashfs_server.h"
#include "runtime/init.h"
#include "runtime/sandbox_plan.h"
#include "runtime/shared_image.h"
#include "runtime/stage_report.h"
#include "runtime/user_namespace.h"
#include "util/files.h"
#include "util/process.h"
#include "util/unique_fd.h"

namespace sqbox {

// The namespaces init is cloned into. Init creates the others itself: the network namespace first
// thing (see enter_loopback_only_network), the cgroup namespace once it is in the sandbox's cgroup.
inline constexpr unsigned long kSandboxNamespaces =
    CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNS;

// Both supervisors (`sqbox run`'s and `sqbox serve`'s), first thing in their new user namespace:
// maps the caller's ids as `config` asks, then stops being dumpable.
IdMapping map_ids_and_seal(const SandboxConfig& config);

// Both supervisors: moves to the private scratch root, mounts `image` at /image and, for a
// squashfs image, forks the FUSE server that serves it (closing `close_in_server` there).
// Returns the server; no process for a directory image. sqbox serve keeps the connection's
// /dev/fuse in `keep_fuse` and a ServerRecord, to start another server if this one dies.
ChildProcess mount_image_and_serve(const ImageSource& image, const IdMapping& ids,
                                   const std::vector<int>& close_in_server,
                                   UniqueFd* keep_fuse = nullptr, ServerRecord* record = nullptr,
                                   FileOpens file_opens = FileOpens::kAnswered);

// Forks a confined image server (runtime/image_server_confinement.h) answering on `fuse_fd`;
// `file_opens` says how it answers opens (FileOpens).
ChildProcess start_image_server(const ImageSource& image, int fuse_fd, const IdMapping& ids,
                                const std::vector<int>& close_in_server, ServerRecord* record,
                                FileOpens file_opens = FileOpens::kAnswered);

// What the supervisor gets from the launcher. It owns the descriptors: each goes to the process
// that needs it (init, the image server) and closes here once handed on.
struct SupervisorContext {
    const SandboxPlan* plan = nullptr;
    const ImageSource* image = nullptr;
    pid_t launcher_pid = 0;
    UniqueFd report;  // StageReport to the launcher
    // Init's end of a SOCK_SEQPACKET channel to the launcher (InitContext::channel).
    UniqueFd init_channel;
    // Where the launcher hands over the shared image server's mount (runtime/image_access.h), if
    // the image may be shared.
    UniqueFd image_handoff;
    // Instead of a server of its own: the shared image server's (runtime/shared_image.h), once
    // received on image_handoff.
    SharedImage shared_image;
};

// Out of the caller's process group: terminal signals reach only the launcher.
void leave_process_group();

// The descriptors the supervisor keeps from the launcher: the image and its context's.
std::vector<int> descriptors_of(const SupervisorContext& context);

// The supervisor's channels to init, both ends until init is cloned.
struct InitChannels {
    Pipe report;    // init's StageReports
    Pipe lifeline;  // the supervisor holds the write end: init dies when it closes
    UniqueFd image_ready;
    UniqueFd init_image_ready;  // one byte when the image is mounted (InitContext::image_ready_fd)

    // In init: drops the supervisor's ends; returns init's, with `channel` (the launcher's).
    InitContext take_init_ends(const SandboxPlan& plan, UniqueFd channel);
    // In the supervisor, once init exists: drops init's ends.
    void close_init_ends();
};
InitChannels make_init_channels();

// What the image server closes: everything of the supervisor's but the image and /dev/fuse.
std::vector<int> server_closes(const SupervisorContext& context, const InitChannels& channels);

// Starts looking up, on a thread, what every start needs (runtime/look_ahead.h; a squashfs image
// only). Call only once no more processes will be forked.
void start_look_ahead_of(const ImageSource& image, const SandboxConfig& config);

// One byte to init: the image is mounted.
void tell_init_image_ready(UniqueFd& image_ready);

// How long a sandbox killed at its timeout may take to end before its supervisor asks whether the
// image server holds it (and again each time after, while it has not ended): a process whose
// request the server has taken cannot die until it is answered.
constexpr std::chrono::milliseconds kKilledSandboxGrace{1000};

// How the sandbox ended, as the supervisor saw it.
struct SandboxEnd {
    bool timed_out = false;
    bool server_died = false;
    int server_wait_status = 0;  // when server_died
    // The image server, if it was still running when init ended (final_report may wait for it).
    ChildProcess* server = nullptr;
    int shared_server = -1;  // the connection to the shared image server, if it serves the image
};

// Until init is gone: kills the sandbox at its deadline or when the image server (its own, or the
// shared one on `shared_server`, -1 if none) dies, and passes the launcher's forwarded signals to
// init.
SandboxEnd watch_sandbox(ChildProcess& init, ChildProcess& server,
                         std::chrono::steady_clock::time_point started,
                         std::optional<double> timeout_seconds, int shared_server = -1);

// "the image server died of signal 11 (Segmentation fault); the image may be corrupt", from its
// wait status.
std::string describe_image_server_death(int wait_status);

// Init's last report, completed with what only the supervisor knows (timeout, a dead image server
// or init). Fails the stage (exits) when there is nothing to report.
StageReport final_report(int init_report_fd, const SandboxEnd& end,
                         std::chrono::steady_clock::time_point started, const SandboxConfig& config,
                         int report_fd);

// A container's --rw start, once the sandbox has ended: saves what it wrote into the container's
// layer (runtime/rootfs.h). A failure is one line on stderr and sqbox's failure status in the
// report: part of the changes may be saved.
void save_container_changes(const SandboxConfig& config, StageReport& report);

// Runs in a fresh user + mount namespace: maps the caller's ids, builds the scratch root, mounts
// the image (starting the FUSE server), starts init in the sandbox's namespaces, enforces the
// wall-clock timeout, forwards the launcher's signals to init, and reports the outcome. Kills the
// FUSE server before exiting; dies with the launcher.
[[noreturn]] void run_supervisor(SupervisorContext context);

}  // namespace sqbox
