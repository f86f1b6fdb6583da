#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace delaycomm {

// Learns that a member of the group has gone (its process ended, or it destroyed or aborted the group) the way
// Gloo's own pairs learn it: a TCP connection that the kernel closes when the process ends (docs/staleness.md,
// "Waits"). The staleness engine's waits on the store (calibration, flush, the hold of a verdict) and at the SSP
// gate end with a clear error as soon as a member they wait for has gone, instead of at the group's timeout.
//
// Topology: a star on group rank 0. Rank 0 listens on an ephemeral port (all interfaces) and publishes, under one
// key of the group's store, a nonce, the port and its addresses (numeric: those its hostname resolves to, which is
// the address Gloo's default device takes, then its other interfaces', then loopback); every other rank connects
// to the first address that answers the handshake (the nonce, echoed), so a listener of another process on the
// same port is never mistaken for rank 0. Rank 0 sees a member's connection close and tells every other member (4
// bytes on its connection); the members see rank 0's connection close themselves. N - 1 connections at rank 0, one
// at each other rank; no traffic otherwise.
//
// What it cannot see: a process that hangs without exiting (the waits' timeout covers it), a host or link that
// dies without closing the connection (as for Gloo, TCP notices only at its own timeouts), and a process whose
// forked children (DataLoader workers) still hold its sockets open, until they exit (Gloo's sockets are held the
// same way). A member that could not connect (no address answered) is watched by no one: a warning says so, and
// its departure is noticed at the timeout only.
//
// Threads: one thread per watch (dc-watch-<group>), started by the constructor, which never blocks (the thread
// publishes or waits for rank 0's address itself). It only reads and writes its sockets, reads the store while it
// connects, and calls onGone (which must not block). gone() from any thread. stop() (or the destructor) from any
// thread but the watch's, once or more: wakes and joins the thread and closes the connections, so that the other
// members see this one go.
class PeerWatch {
 public:
  // onGone: called on the watch thread each time a member is found gone.
  PeerWatch(int rank, int size, c10::intrusive_ptr<c10d::Store> store, std::string groupName,
            std::function<void()> onGone);
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  void stop();
  // The members found gone so far, in the order found.
  std::vector<int> gone() const;
  // How many members have been found gone (cheap: read by every slice of a wait).
  uint64_t goneCount() const { return goneCount_.load(std::memory_order_acquire); }

  // The store key rank 0 publishes its address under (relative to the engine's store).
  static constexpr const char* kAddressKey = "peerwatch/address";

 private:
  void runHub();     // rank 0's thread
  void runMember();  // the other ranks' thread
  void markGone(int rank);
  // Waits up to timeoutMs for fd to be ready for `events` (POLLIN/POLLOUT); false on timeout or when stopped.
  bool pollOne(int fd, short events, int timeoutMs) const;
  int connectToHub(const std::string& address);

  const int rank_;
  const int size_;
  c10::intrusive_ptr<c10d::Store> store_;
  const std::string groupName_;
  std::function<void()> onGone_;
  uint64_t nonce_ = 0;
  int wakeFd_ = -1;  // an eventfd: stop() writes it, the thread polls it
  std::thread thread_;
  std::once_flag stopped_;

  mutable std::mutex mutex_;
  std::vector<int> gone_;
  std::atomic<uint64_t> goneCount_{0};
};

}  // namespace delaycomm
