// The peer watch (stale/PeerWatch.hpp). Design notes: docs/staleness.md, "Waits".

#include "stale/PeerWatch.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

namespace delaycomm {

namespace {

constexpr int kConnectMs = 1000;    // per address a member tries
constexpr int kHandshakeMs = 2000;  // for the nonce to come back (or, at rank 0, to arrive)
constexpr int kAddressPollMaxMs = 100;

// The 12 bytes a member sends first: rank 0's nonce, then the member's rank.
struct Hello {
  uint64_t nonce;
  uint32_t rank;
} __attribute__((packed));

std::string numericHost(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST];
  if (getnameinfo(addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) {
    return "";
  }
  return host;
}

bool isLinkLocal6(const sockaddr* addr) {
  return addr->sa_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
}

// Rank 0's addresses, most likely first: the interfaces GLOO_SOCKET_IFNAME names (Gloo's choice when it is set),
// those its hostname resolves to (Gloo's default device), its other interfaces', loopback. Numeric, so that no
// member resolves a name.
std::vector<std::string> hubAddresses() {
  std::vector<std::string> preferred;
  std::vector<std::string> others;
  auto add = [](std::vector<std::string>& to, const std::string& a) {
    if (!a.empty() && std::find(to.begin(), to.end(), a) == to.end()) {
      to.push_back(a);
    }
  };
  std::vector<std::string> ifnames;
  if (const char* env = std::getenv("GLOO_SOCKET_IFNAME")) {
    std::istringstream in(env);
    for (std::string name; std::getline(in, name, ',');) {
      ifnames.push_back(name);
    }
  }
  char hostname[256] = {0};
  if (gethostname(hostname, sizeof(hostname) - 1) == 0) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(hostname, nullptr, &hints, &res) == 0) {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        if (!isLinkLocal6(ai->ai_addr)) {
          add(ifnames.empty() ? preferred : others, numericHost(ai->ai_addr, ai->ai_addrlen));
        }
      }
      freeaddrinfo(res);
    }
  }
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK) ||
          (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) || isLinkLocal6(i->ifa_addr)) {
        continue;
      }
      const socklen_t len = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      const bool named = std::find(ifnames.begin(), ifnames.end(), i->ifa_name) != ifnames.end();
      add(named ? preferred : others, numericHost(i->ifa_addr, len));
    }
    freeifaddrs(ifs);
  }
  for (const auto& a : others) {
    add(preferred, a);
  }
  add(preferred, "127.0.0.1");
  return preferred;
}

// A listening socket on every interface (IPv6 with IPv4 mapped, else IPv4) and an ephemeral port; -1 on failure.
int listenAny(int backlog, uint16_t* port) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int off = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      if (fd >= 0) {
        close(fd);
      }
      return -1;
    }
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (listen(fd, backlog) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

// Whether `fd` reports end of stream or an error (a closed connection); reads and discards whatever it sent.
bool closedByPeer(int fd, std::string* received = nullptr) {
  char buf[256];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      if (received) {
        received->append(buf, static_cast<size_t>(n));
      }
      continue;
    }
    if (n == 0) {
      return true;
    }
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
}

void sendRank(int fd, int rank) {
  const uint32_t r = htonl(static_cast<uint32_t>(rank));
  (void)!send(fd, &r, sizeof(r), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

PeerWatch::PeerWatch(int rank, int size, c10::intrusive_ptr<c10d::Store> store, std::string groupName,
                     std::function<void()> onGone)
    : rank_(rank), size_(size), store_(std::move(store)), groupName_(std::move(groupName)), onGone_(std::move(onGone)) {
  if (size_ < 2) {
    return;  // nobody to watch
  }
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  TORCH_CHECK(wakeFd_ >= 0, "delaycomm: staleness on group '", groupName_,
              "': could not create the peer watch's eventfd: ", std::strerror(errno));
  if (rank_ == 0) {
    nonce_ = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
             static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), ("dc-watch-" + groupName_).substr(0, 15).c_str());
    rank_ == 0 ? runHub() : runMember();
  });
}

PeerWatch::~PeerWatch() {
  stop();
}

void PeerWatch::stop() {
  std::call_once(stopped_, [this] {
    if (wakeFd_ < 0) {
      return;
    }
    const uint64_t one = 1;
    (void)!write(wakeFd_, &one, sizeof(one));
    if (thread_.joinable()) {
      thread_.join();
    }
    close(wakeFd_);
  });
}

std::vector<int> PeerWatch::gone() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return gone_;
}

void PeerWatch::markGone(int rank) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::find(gone_.begin(), gone_.end(), rank) != gone_.end()) {
      return;
    }
    gone_.push_back(rank);
    goneCount_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (onGone_) {
    onGone_();
  }
}

bool PeerWatch::pollOne(int fd, short events, int timeoutMs) const {
  pollfd fds[2] = {{wakeFd_, POLLIN, 0}, {fd, events, 0}};
  while (true) {
    const int n = poll(fds, 2, timeoutMs);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    return n > 0 && !(fds[0].revents & POLLIN) && fds[1].revents != 0;
  }
}

void PeerWatch::runHub() {
  uint16_t port = 0;
  const int listener = listenAny(size_, &port);
  std::ostringstream address;
  address << nonce_ << ' ' << port;
  for (const auto& a : hubAddresses()) {
    address << ' ' << a;
  }
  try {
    TORCH_CHECK(listener >= 0, "could not listen: ", std::strerror(errno));
    const std::string text = address.str();
    store_->set(kAddressKey, std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception& e) {
    LOG(WARNING) << "delaycomm: staleness on group '" << groupName_ << "': the peer watch could not start (" << e.what()
                 << "): a member that leaves while others wait is noticed at the group's timeout only";
    if (listener >= 0) {
      close(listener);
    }
    return;
  }
  struct Member {
    int fd;
    int rank;
  };
  std::vector<Member> members;
  std::vector<pollfd> fds;
  while (true) {
    fds.assign({{wakeFd_, POLLIN, 0}, {listener, POLLIN, 0}});
    for (const auto& m : members) {
      fds.push_back({m.fd, POLLIN | POLLRDHUP, 0});
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) {
        continue;
      }
      break;
    }
    if (fds[0].revents & POLLIN) {
      break;
    }
    if (fds[1].revents & POLLIN) {
      const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      Hello hello{};
      if (fd >= 0 && pollOne(fd, POLLIN, kHandshakeMs) &&
          recv(fd, &hello, sizeof(hello), MSG_WAITALL) == static_cast<ssize_t>(sizeof(hello)) &&
          hello.nonce == nonce_ && ntohl(hello.rank) > 0 && static_cast<int>(ntohl(hello.rank)) < size_) {
        (void)!send(fd, &nonce_, sizeof(nonce_), MSG_NOSIGNAL);
        for (int r : gone()) {
          sendRank(fd, r);  // what it missed
        }
        members.push_back({fd, static_cast<int>(ntohl(hello.rank))});
      } else if (fd >= 0) {
        close(fd);  // not a member of this group (another job, a port scan)
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0 || !closedByPeer(fds[i].fd)) {
        continue;
      }
      auto it = std::find_if(members.begin(), members.end(), [&](const Member& m) { return m.fd == fds[i].fd; });
      const int rank = it->rank;
      close(it->fd);
      members.erase(it);
      markGone(rank);
      for (const auto& m : members) {
        sendRank(m.fd, rank);
      }
    }
  }
  for (const auto& m : members) {
    close(m.fd);
  }
  close(listener);
}

int PeerWatch::connectToHub(const std::string& address) {
  std::istringstream in(address);
  uint64_t nonce = 0;
  std::string port;
  in >> nonce >> port;
  for (std::string host; in >> host;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) {
      continue;
    }
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      const Hello hello{nonce, htonl(static_cast<uint32_t>(rank_))};
      uint64_t echoed = 0;
      const bool ok =
          (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS) && pollOne(fd, POLLOUT, kConnectMs) &&
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 &&
          send(fd, &hello, sizeof(hello), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(hello)) &&
          pollOne(fd, POLLIN, kHandshakeMs) &&
          recv(fd, &echoed, sizeof(echoed), MSG_WAITALL) == static_cast<ssize_t>(sizeof(echoed)) && echoed == nonce;
      if (ok) {
        freeaddrinfo(res);
        return fd;
      }
      close(fd);
    }
    freeaddrinfo(res);
  }
  return -1;
}

void PeerWatch::runMember() {
  std::string address;
  int backoffMs = 1;
  std::string problem;
  while (address.empty()) {
    try {
      if (store_->check({kAddressKey})) {
        const auto bytes = store_->get(kAddressKey);
        address.assign(bytes.begin(), bytes.end());
        break;
      }
    } catch (const std::exception& e) {
      problem = e.what();
      break;
    }
    pollfd wake{wakeFd_, POLLIN, 0};
    if (poll(&wake, 1, backoffMs) > 0) {
      return;  // stopped
    }
    backoffMs = std::min(2 * backoffMs, kAddressPollMaxMs);
  }
  const int fd = address.empty() ? -1 : connectToHub(address);
  if (fd < 0) {
    pollfd wake{wakeFd_, POLLIN, 0};
    if (poll(&wake, 1, 0) == 0) {  // not stopped meanwhile
      LOG(WARNING) << "delaycomm: staleness on group '" << groupName_ << "': rank " << rank_
                   << " could not connect its peer watch to rank 0 ("
                   << (problem.empty() ? "no address of '" + address + "' answered" : problem)
                   << "): a member that leaves while others wait is noticed at the group's timeout only";
    }
    return;
  }
  std::string pending;  // notices arrive as 4-byte ranks
  while (true) {
    pollfd fds[2] = {{wakeFd_, POLLIN, 0}, {fd, POLLIN | POLLRDHUP, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) {
        continue;
      }
      break;
    }
    if (fds[0].revents & POLLIN) {
      break;
    }
    const bool closed = closedByPeer(fd, &pending);
    for (; pending.size() >= sizeof(uint32_t); pending.erase(0, sizeof(uint32_t))) {
      uint32_t r = 0;
      std::memcpy(&r, pending.data(), sizeof(r));
      markGone(static_cast<int>(ntohl(r)));
    }
    if (closed) {
      markGone(0);
      break;
    }
  }
  close(fd);
}

}  // namespace delaycomm
