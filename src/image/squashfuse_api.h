// The parts of libsquashfuse sqbox uses, behind one include with the C linkage it needs.
#pragma once

#include <sys/stat.h>

extern "C" {
#include <squashfuse/ll.h>

// Implemented in libsquashfuse (stat.c) but not declared by the headers Debian installs.
sqfs_err sqfs_stat(sqfs* fs, sqfs_inode* inode, struct stat* st);
}
