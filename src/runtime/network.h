// The sandbox's network: its own namespace with nothing but loopback.
#pragma once

namespace sqbox {

// Brings up "lo" in the calling process's (new) network namespace.
void bring_up_loopback();

}  // namespace sqbox
