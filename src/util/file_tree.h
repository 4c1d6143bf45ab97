// Removing a directory tree that someone else may have made: without following symlinks,
// without crossing into another mount, and whatever its depth or its directories' modes.
#pragma once

#include <string>

namespace sqbox {

// Removes `path` and everything below it, making directories writable first where needed
// (overlayfs leaves its work directories at mode 000; an image's unpacked directories keep the
// image's modes). A missing `path` is fine. Throws Error if something
// cannot be removed, if a mount point is found below it, or if the tree changes shape while it
// is being removed.
void remove_tree(const std::string& path);

// remove_tree for entry `name` of the directory open at `parent`, whatever its kind (a file is
// unlinked); `what` names it in messages.
void remove_tree_at(int parent, const std::string& name, const std::string& what);

}  // namespace sqbox
