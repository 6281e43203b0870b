// What fork() does to ndwv. The device lives in the process (its sockets, its engine thread), and
// a child forked without exec inherits the sockets but not the threads: it would keep the
// parent's connections and listening ports open behind the parent's back (a listener the parent
// closed would still take connections; its port could not be bound again) and could reach none
// of them. Linux has no close-on-fork flag, so every descriptor the library opens is registered
// here from its creation to its close, and a fork handler closes them all in the child. The
// child then has no RDMA state: the device is gone there (opening it returns
// WV_DEVICE_REMOVED), and objects inherited from the parent are left alone, never destroyed
// (their destructors would wait for threads that did not follow the fork). The parent loses
// nothing: a user-space device places data through virtual addresses, so its registrations stay
// valid across the fork, copy-on-write or not.
#pragma once
#include <cstdint>

namespace ndwv::base {

namespace fork_detail {
void Lock();
void Unlock();  // keeps errno
void Register(int fd);
}  // namespace fork_detail

// Opens a descriptor with `open` (a callable returning it, or -1 with errno set) and registers
// it. Both happen under the registry's lock, so a fork on another thread cannot fall between them
// and leave the child an unregistered copy.
template <class Open>
int OpenDescriptor(Open open) {
  fork_detail::Lock();
  int fd = open();
  if (fd >= 0) fork_detail::Register(fd);
  fork_detail::Unlock();
  return fd;
}

// socket(2) (protocol 0), registered.
int OpenSocket(int family, int type);

// pipe2(2), both ends registered.
int OpenPipe(int ends[2], int flags);

// Unregisters and closes a descriptor that OpenDescriptor or OpenPipe opened.
void CloseDescriptor(int fd);

// How many forks separate this process from the one that loaded the library: 0 in it, 1 in its
// child, and so on. An object compares it with the value at its creation: one made before the
// fork is the parent's, and is not destroyed here.
uint32_t ForkGeneration();

// True in a process forked (at any remove) from one in which the library held descriptors: the
// device state it inherited is the parent's, unusable here, so the device is gone.
bool ForkedFromDevice();

}  // namespace ndwv::base
