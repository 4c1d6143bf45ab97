// The sandbox's network: its own namespace with nothing but loopback.
#pragma once

namespace sqbox {

// Moves the calling process into a new network namespace (owned by its user namespace) and brings
// up "lo" there. Init does this itself rather than getting the namespace from clone(2): it is the
// costliest namespace to create, and this way it is built while the supervisor mounts the image.
void enter_loopback_only_network();

}  // namespace sqbox
