// HTTP/1.1 on one epoll thread (see http_server.h). One request at a time per connection: a pipelined request waits
// in the buffer until the one before it is answered, so answers go out in order with no bookkeeping. A connection
// that closes while its request is served withdraws the request (Gone), as the Python front end cancels its handler.
// Requests the edge does not take go to the Python front end from a small pool of threads, one blocking
// round trip each (health, metadata, config, /metrics and admin calls: rare, and none on the data path).

#include "http_server.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace accscale {

namespace {

constexpr size_t kMaxHead = 64 << 10;     // request line and headers; more gets 431
constexpr size_t kMaxChunkLine = 1024;    // a chunk's size line
constexpr int kSweepMs = 100;             // how often deadlines are checked
constexpr int kForwarders = 4;            // threads passing requests to the Python front end
constexpr int kForwardTimeoutS = 300;     // an admin call may wait on a worker; the Python side always answers
constexpr size_t kMaxForwards = 1024;     // requests waiting for a forwarder; more get 503
constexpr size_t kKeepCapacity = 64 << 10;  // a buffer emptied after a larger request gives its memory back

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

const char* Reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Request Entity Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
  }
}

// headers a hop sets for itself, never passed on
bool HopByHop(const std::string& lower) {
  return lower == "connection" || lower == "keep-alive" || lower == "transfer-encoding" ||
         lower == "content-length" || lower == "expect" || lower == "upgrade" || lower == "te" ||
         lower == "trailer" || lower == "proxy-connection";
}

// Chunked transfer coding, decoded as its bytes arrive: Feed consumes what it can of `data` from `pos`.
class Dechunker {
 public:
  enum Result { kMore, kDone, kBad, kTooLarge };
  Result Feed(const std::string& data, size_t* pos, std::string* body, size_t max_body) {
    for (;;) {
      if (state_ == kSize || state_ == kTrailer) {
        size_t eol = data.find("\r\n", *pos);
        if (eol == std::string::npos) return data.size() - *pos > kMaxChunkLine ? kBad : kMore;
        std::string line = data.substr(*pos, eol - *pos);
        *pos = eol + 2;
        if (state_ == kTrailer) {
          if (line.empty()) return kDone;
          continue;  // a trailer field: not kept
        }
        line = line.substr(0, line.find(';'));  // chunk extensions are ignored
        line = Trim(line);
        if (line.empty() || line.size() > 15 || line.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
          return kBad;
        left_ = std::stoull(line, nullptr, 16);
        if (left_ == 0) {
          state_ = kTrailer;
          continue;
        }
        if (body->size() + left_ > max_body) return kTooLarge;
        state_ = kData;
      }
      if (state_ == kData) {
        size_t n = std::min<size_t>(left_, data.size() - *pos);
        body->append(data, *pos, n);
        *pos += n;
        left_ -= n;
        if (left_ > 0) return kMore;
        state_ = kDataEnd;
      }
      if (state_ == kDataEnd) {
        if (data.size() - *pos < 2) return kMore;
        if (data.compare(*pos, 2, "\r\n") != 0) return kBad;
        *pos += 2;
        state_ = kSize;
      }
    }
  }

 private:
  enum { kSize, kData, kDataEnd, kTrailer } state_ = kSize;
  uint64_t left_ = 0;
};

std::string Serialize(const HttpResponse& r, bool keep_alive, bool http10) {
  std::string out;
  out.reserve(160 + r.body.size());
  char line[64];
  std::snprintf(line, sizeof line, "HTTP/1.1 %d %s\r\n", r.status, Reason(r.status));
  out += line;
  for (const auto& [name, value] : r.headers) {
    out += name;
    out += ": ";
    out += value;
    out += "\r\n";
  }
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  if (!keep_alive) out += "Connection: close\r\n";
  else if (http10) out += "Connection: keep-alive\r\n";
  out += "\r\n";
  out += r.body;
  return out;
}

HttpResponse Error(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.headers.emplace_back("Content-Type", "application/json");
  r.body = JsonError(message);
  return r;
}

}  // namespace

std::string JsonError(const std::string& message) {
  rapidjson::StringBuffer text;
  rapidjson::Writer<rapidjson::StringBuffer> w(text);
  w.StartObject();
  w.Key("error");
  w.String(message.data(), static_cast<rapidjson::SizeType>(message.size()));
  w.EndObject();
  return std::string(text.GetString(), text.GetSize());
}

struct HttpServer::Impl {
  // kLinger: answered, and our side shut; what the client still sends is read and dropped until it closes (or the
  // read timeout), as closing with unread bytes would reset the connection and could lose the answer before the
  // client reads it (a 413 sent while the client still writes its body)
  enum class State { kHead, kBody, kWaiting, kWriting, kLinger };

  struct Conn {
    int fd = -1;
    uint64_t id = 0;
    State state = State::kHead;
    std::string in;
    size_t pos = 0;  // where the request being read starts in `in` (then: how far its body is consumed)
    std::string out;
    size_t out_pos = 0;
    int64_t deadline_ms = 0;  // kHead and kWriting: closed then; kBody: 408 then
    bool close_after = false;
    bool http10 = false;
    size_t scanned = 0;     // where the search for the end of the headers resumes
    bool want_out = false;  // EPOLLOUT armed
    size_t lingered = 0;    // bytes dropped while lingering
    HttpRequest request;
    bool chunked = false;
    size_t length = 0;
    Dechunker dechunk;
  };

  HttpOptions options;
  Take take;
  Gone gone;
  int listen_fd = -1, epoll_fd = -1, wake_fd = -1;
  int port = 0;
  std::unordered_map<int, std::unique_ptr<Conn>> by_fd;
  std::unordered_map<uint64_t, Conn*> by_id;
  uint64_t next_id = 1;
  bool listening = true;

  std::mutex mu;  // guards `answers` and `stopping`
  std::deque<std::pair<uint64_t, HttpResponse>> answers;
  bool stopping = false;
  std::thread io;

  // the forwarders' queue
  std::mutex forward_mu;
  std::condition_variable forward_ready;
  std::deque<std::pair<uint64_t, HttpRequest>> forwards;
  std::vector<int> forwarding;  // the sockets of round trips in flight
  bool forward_stop = false;
  std::vector<std::thread> forwarders;

  void Start() {
    addrinfo hints{}, *found = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    std::string service = std::to_string(options.port);
    const char* host = options.host.empty() ? nullptr : options.host.c_str();
    if (getaddrinfo(host, service.c_str(), &hints, &found) != 0 || !found)
      throw std::runtime_error("the native edge cannot resolve " + options.host);
    for (addrinfo* a = found; a && listen_fd < 0; a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) listen_fd = fd;
      else close(fd);
    }
    freeaddrinfo(found);
    if (listen_fd < 0)
      throw std::runtime_error("the native edge cannot bind HTTP at " + options.host + ":" + service);
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
    port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd < 0 || wake_fd < 0) throw std::runtime_error("epoll or eventfd failed");
    Watch(listen_fd, EPOLLIN, EPOLL_CTL_ADD);
    Watch(wake_fd, EPOLLIN, EPOLL_CTL_ADD);
    io = std::thread([this] {
      pthread_setname_np(pthread_self(), "edge-http");  // as top -H and /proc name it
      Run();
    });
    for (int i = 0; i < kForwarders; ++i) {
      forwarders.emplace_back([this] {
        pthread_setname_np(pthread_self(), "edge-forward");
        Forwarder();
      });
    }
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return;
      stopping = true;
    }
    Wake();
    if (io.joinable()) io.join();
    {
      std::lock_guard<std::mutex> lock(forward_mu);
      forward_stop = true;
      for (int fd : forwarding) shutdown(fd, SHUT_RDWR);  // a round trip in flight ends now, not at its timeout
    }
    forward_ready.notify_all();
    for (auto& t : forwarders) t.join();
    forwarders.clear();
  }

  ~Impl() {
    Stop();  // the I/O thread closes the connections as it stops
    if (listen_fd >= 0) close(listen_fd);
    if (epoll_fd >= 0) close(epoll_fd);
    if (wake_fd >= 0) close(wake_fd);
  }

  void Wake() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd, &one, sizeof one);
  }

  void Watch(int fd, uint32_t events, int op) {
    epoll_event e{};
    e.events = events;
    e.data.fd = fd;
    epoll_ctl(epoll_fd, op, fd, &e);
  }

  void Run() {
    epoll_event events[256];
    int64_t next_sweep = NowMs() + kSweepMs;
    for (;;) {
      int n = epoll_wait(epoll_fd, events, 256, kSweepMs);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping) break;
      }
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd == listen_fd) Accept();
        else if (fd == wake_fd) Deliver();
        else OnEvent(fd, events[i].events);
      }
      int64_t now = NowMs();
      if (now >= next_sweep) {
        Sweep(now);
        next_sweep = now + kSweepMs;
      }
    }
    // stopped: every connection closes now, so no client waits on an answer that will not come
    for (auto& [fd, conn] : by_fd) {
      epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
      close(fd);
    }
    by_fd.clear();
    by_id.clear();
  }

  void Accept() {
    for (;;) {
      int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {  // out of descriptors: stop accepting until the next sweep
          Watch(listen_fd, 0, EPOLL_CTL_MOD);
          listening = false;
        }
        return;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto conn = std::make_unique<Conn>();
      conn->fd = fd;
      conn->id = next_id++;
      conn->deadline_ms = NowMs() + options.idle_timeout_ms;
      by_id[conn->id] = conn.get();
      by_fd[fd] = std::move(conn);
      Watch(fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
    }
  }

  void Close(Conn* c) {
    bool was_waiting = c->state == State::kWaiting;
    uint64_t id = c->id;
    int fd = c->fd;
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    by_id.erase(id);
    by_fd.erase(fd);  // c is gone
    if (was_waiting) {
      gone(id);
      DropForward(id);
    }
  }

  // A request waiting for a forwarder whose client has gone is not passed on.
  void DropForward(uint64_t id) {
    std::lock_guard<std::mutex> lock(forward_mu);
    for (auto it = forwards.begin(); it != forwards.end(); ++it)
      if (it->first == id) {
        forwards.erase(it);
        return;
      }
  }

  static void Release(std::string* buffer) {
    if (buffer->empty() && buffer->capacity() > kKeepCapacity) std::string().swap(*buffer);
  }

  void OnEvent(int fd, uint32_t events) {
    auto it = by_fd.find(fd);
    if (it == by_fd.end()) return;
    Conn* c = it->second.get();
    if (events & EPOLLOUT) {
      if (!Flush(c)) return;
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      char buffer[65536];
      bool ended = false;
      for (;;) {
        ssize_t got = read(fd, buffer, sizeof buffer);
        if (got > 0 && c->state == State::kLinger) {
          c->lingered += static_cast<size_t>(got);
          if (c->lingered > options.max_body + kMaxHead) {
            Close(c);
            return;
          }
          continue;
        }
        if (got > 0) {
          c->in.append(buffer, static_cast<size_t>(got));
          // what a client sends ahead while its request is served is bounded as one more request is
          if (c->in.size() - c->pos > kMaxHead + options.max_body + 4096) {
            Close(c);
            return;
          }
          continue;
        }
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        ended = true;  // EOF or an error: the client has gone
        break;
      }
      uint64_t id = c->id;
      Parse(c);  // what came before the end is read (an error in it is answered, for a client still reading)
      // a request the client waits on is withdrawn: it has gone
      if (ended && by_id.count(id)) Close(c);
    }
  }

  // Reads requests from the buffer while the connection is free to take one.
  void Parse(Conn* c) {
    while (c->state == State::kHead || c->state == State::kBody) {
      if (c->state == State::kHead) {
        // the search resumes where the last one ended: headers arriving a few bytes at a time cost no rescans
        size_t end = c->in.find("\r\n\r\n", std::max(c->pos, c->scanned));
        if (end == std::string::npos) {
          if (c->in.size() - c->pos > kMaxHead) return Refuse(c, 431, "the request's headers are too large");
          c->scanned = c->in.size() >= 3 ? c->in.size() - 3 : 0;
          return;
        }
        c->scanned = 0;
        if (end - c->pos > kMaxHead) return Refuse(c, 431, "the request's headers are too large");
        if (!ReadHead(c, c->in.substr(c->pos, end - c->pos))) return;
        c->pos = end + 4;
        c->state = State::kBody;
        c->deadline_ms = NowMs() + options.read_timeout_ms;
        // a client that waits for leave to send its body (curl does, over 1 KiB) is told to go on
        const std::string* expect = c->request.Header("expect");
        bool body_pending = c->chunked ? c->in.size() == c->pos : c->in.size() - c->pos < c->length;
        if (expect && !c->http10 && Lower(Trim(*expect)) == "100-continue" && body_pending &&
            !Send(c, "HTTP/1.1 100 Continue\r\n\r\n"))
          return;
      }
      if (c->chunked) {
        switch (c->dechunk.Feed(c->in, &c->pos, &c->request.body, options.max_body)) {
          case Dechunker::kMore: Compact(c); return;
          case Dechunker::kBad: return Refuse(c, 400, "the chunked body is malformed");
          case Dechunker::kTooLarge: return Refuse(c, 413, "the request body is larger than the limit of " +
                                                          std::to_string(options.max_body) + " bytes");
          case Dechunker::kDone: break;
        }
      } else {
        if (c->in.size() - c->pos < c->length) return;
        c->request.body.assign(c->in, c->pos, c->length);
        c->pos += c->length;
      }
      if (!Dispatch(c)) return;
    }
  }

  // drops what is consumed from the front of the buffer
  void Compact(Conn* c) {
    if (c->pos > 0) {
      c->in.erase(0, c->pos);
      c->pos = 0;
      c->scanned = 0;
    }
    Release(&c->in);
  }

  bool ReadHead(Conn* c, const std::string& head) {
    HttpRequest& r = c->request;
    r = HttpRequest();
    c->chunked = false;
    c->length = 0;
    c->dechunk = Dechunker();
    size_t eol = head.find("\r\n");
    std::string line = head.substr(0, eol);
    size_t a = line.find(' '), b = line.rfind(' ');
    if (a == std::string::npos || b == a) return Refuse(c, 400, "the request line is malformed"), false;
    r.method = line.substr(0, a);
    r.target = line.substr(a + 1, b - a - 1);
    std::string version = line.substr(b + 1);
    if (version != "HTTP/1.1" && version != "HTTP/1.0")
      return Refuse(c, 400, "the request line is malformed"), false;
    if (r.method.empty() || r.target.empty() || r.target[0] != '/')
      return Refuse(c, 400, "the request line is malformed"), false;
    r.path = r.target.substr(0, r.target.find('?'));
    c->http10 = version == "HTTP/1.0";
    size_t at = eol == std::string::npos ? head.size() : eol + 2;
    while (at < head.size()) {
      size_t next = head.find("\r\n", at);
      if (next == std::string::npos) next = head.size();
      std::string field = head.substr(at, next - at);
      at = next + 2;
      size_t colon = field.find(':');
      // no space inside a name (RFC 9112: "Content-Length : 5" is refused, not read as another header)
      if (colon == std::string::npos || colon == 0 || field.find_first_of(" \t") < colon)
        return Refuse(c, 400, "a header is malformed"), false;
      r.headers.emplace_back(Lower(field.substr(0, colon)), Trim(field.substr(colon + 1)));
    }
    int lengths = 0;
    for (const auto& [name, value] : r.headers) lengths += name == "content-length";
    if (lengths > 1) return Refuse(c, 400, "Content-Length is given more than once"), false;
    std::string connection = r.Header("connection") ? Lower(*r.Header("connection")) : "";
    r.keep_alive = c->http10 ? connection.find("keep-alive") != std::string::npos
                             : connection.find("close") == std::string::npos;
    const std::string* coding = r.Header("transfer-encoding");
    const std::string* length = r.Header("content-length");
    if (coding) {
      if (Lower(*coding) != "chunked" || length)
        return Refuse(c, 400, "only the chunked transfer coding is understood, without a Content-Length"), false;
      c->chunked = true;
      return true;
    }
    if (length) {
      if (length->empty() || length->size() > 19 || length->find_first_not_of("0123456789") != std::string::npos)
        return Refuse(c, 400, "Content-Length is not a number"), false;
      c->length = std::stoull(*length);
      if (c->length > options.max_body)
        return Refuse(c, 413, "Maximum request body size " + std::to_string(options.max_body) +
                                  " exceeded, actual body size " + *length), false;
    }
    return true;
  }

  // false when the connection was closed (c is gone)
  bool Dispatch(Conn* c) {
    c->state = State::kWaiting;
    c->close_after = !c->request.keep_alive;
    Compact(c);
    HttpRequest& request = c->request;
    if (take(c->id, request)) return true;
    {
      std::lock_guard<std::mutex> lock(forward_mu);
      if (forwards.size() < kMaxForwards) {
        forwards.emplace_back(c->id, std::move(request));
        forward_ready.notify_one();
        return true;
      }
    }
    c->state = State::kWriting;
    c->deadline_ms = NowMs() + options.idle_timeout_ms;
    return Send(c, Serialize(Error(503, "the sidecar's HTTP front end is busy"), !c->close_after, c->http10));
  }

  // An error of the transport: answered, and the connection closed after it.
  void Refuse(Conn* c, int status, const std::string& message) {
    c->close_after = true;
    c->state = State::kWriting;
    c->deadline_ms = NowMs() + options.idle_timeout_ms;
    c->in.clear();
    c->pos = 0;
    Release(&c->in);
    Send(c, Serialize(Error(status, message), false, c->http10));
  }

  // false when the connection was closed (c is gone)
  bool Send(Conn* c, const std::string& bytes) {
    c->out += bytes;
    return Flush(c);
  }

  // Writes what it can; false when the connection was closed.
  bool Flush(Conn* c) {
    while (c->out_pos < c->out.size()) {
      ssize_t n = send(c->fd, c->out.data() + c->out_pos, c->out.size() - c->out_pos, MSG_NOSIGNAL);
      if (n > 0) {
        c->out_pos += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!c->want_out) {
          c->want_out = true;
          Watch(c->fd, EPOLLIN | EPOLLRDHUP | EPOLLOUT, EPOLL_CTL_MOD);
        }
        return true;
      }
      Close(c);
      return false;
    }
    c->out.clear();
    c->out_pos = 0;
    Release(&c->out);
    if (c->want_out) {
      c->want_out = false;
      Watch(c->fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
    }
    if (c->state == State::kWriting) {
      if (c->close_after) {
        shutdown(c->fd, SHUT_WR);
        c->state = State::kLinger;
        c->deadline_ms = NowMs() + options.read_timeout_ms;
        c->in.clear();
        c->pos = 0;
        return true;
      }
      c->state = State::kHead;
      c->deadline_ms = NowMs() + options.idle_timeout_ms;
      uint64_t id = c->id;
      Parse(c);  // a pipelined request waiting in the buffer
      return by_id.count(id) > 0;
    }
    return true;
  }

  void Deliver() {
    uint64_t drained;
    [[maybe_unused]] ssize_t n = read(wake_fd, &drained, sizeof drained);
    std::deque<std::pair<uint64_t, HttpResponse>> got;
    {
      std::lock_guard<std::mutex> lock(mu);
      got.swap(answers);
    }
    for (auto& [id, response] : got) {
      auto it = by_id.find(id);
      if (it == by_id.end() || it->second->state != State::kWaiting) continue;  // the client left
      Conn* c = it->second;
      c->state = State::kWriting;
      c->deadline_ms = NowMs() + options.idle_timeout_ms;
      Send(c, Serialize(response, !c->close_after, c->http10));
    }
  }

  void Sweep(int64_t now) {
    if (!listening) {
      listening = true;
      Watch(listen_fd, EPOLLIN, EPOLL_CTL_MOD);
    }
    std::vector<Conn*> due;
    for (auto& [fd, c] : by_fd)
      if (c->state != State::kWaiting && now >= c->deadline_ms) due.push_back(c.get());
    for (Conn* c : due) {
      if (c->state == State::kBody) {
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%g", options.read_timeout_ms / 1000.0);
        Refuse(c, 408, std::string("the request body did not arrive within ") + seconds + " s");
      } else {
        Close(c);  // idle, stuck in its headers, not reading its answer, or done lingering
      }
    }
  }

  void Push(uint64_t id, HttpResponse response) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return;
      answers.emplace_back(id, std::move(response));
    }
    Wake();
  }

  // ---- passing requests to the Python front end
  void Forwarder() {
    for (;;) {
      std::pair<uint64_t, HttpRequest> job;
      {
        std::unique_lock<std::mutex> lock(forward_mu);
        forward_ready.wait(lock, [&] { return forward_stop || !forwards.empty(); });
        if (forward_stop) return;
        job = std::move(forwards.front());
        forwards.pop_front();
      }
      Push(job.first, RoundTrip(job.second));
    }
  }

  HttpResponse RoundTrip(const HttpRequest& r) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Error(502, "the sidecar's HTTP front end cannot be reached");
    {
      std::lock_guard<std::mutex> lock(forward_mu);
      if (forward_stop) {
        close(fd);
        return Error(503, "the sidecar is stopping");
      }
      forwarding.push_back(fd);
    }
    HttpResponse answer = Exchange(fd, r);
    {
      std::lock_guard<std::mutex> lock(forward_mu);
      forwarding.erase(std::find(forwarding.begin(), forwarding.end(), fd));
    }
    close(fd);
    return answer;
  }

  HttpResponse Exchange(int fd, const HttpRequest& r) {
    timeval timeout{kForwardTimeoutS, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, options.forward_to.c_str(), sizeof address.sun_path - 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
      return Error(502, "the sidecar's HTTP front end cannot be reached");
    {
      std::lock_guard<std::mutex> lock(forward_mu);  // a stop between registering and connecting missed this socket
      if (forward_stop) return Error(503, "the sidecar is stopping");
    }
    std::string out = r.method + " " + r.target + " HTTP/1.1\r\n";
    for (const auto& [name, value] : r.headers)
      if (!HopByHop(name)) out += name + ": " + value + "\r\n";
    out += "Content-Length: " + std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n";
    out += r.body;
    size_t sent = 0;
    while (sent < out.size()) {
      ssize_t n = send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    std::string in;
    char buffer[65536];
    for (;;) {
      ssize_t n = read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      in.append(buffer, static_cast<size_t>(n));
    }
    HttpResponse answer;
    size_t end = in.find("\r\n\r\n");
    int status = 0;
    if (end == std::string::npos || std::sscanf(in.c_str(), "HTTP/1.%*d %d", &status) != 1 || status < 100)
      return Error(502, "the sidecar's HTTP front end did not answer");
    answer.status = status;
    bool chunked = false;
    size_t length = std::string::npos;
    size_t at = in.find("\r\n") + 2;
    while (at < end) {
      size_t next = in.find("\r\n", at);
      std::string field = in.substr(at, next - at);
      at = next + 2;
      size_t colon = field.find(':');
      if (colon == std::string::npos) continue;
      std::string name = Lower(field.substr(0, colon)), value = Trim(field.substr(colon + 1));
      if (name == "transfer-encoding") chunked = Lower(value) == "chunked";
      if (name == "content-length") length = std::strtoull(value.c_str(), nullptr, 10);
      if (!HopByHop(name) && name != "date" && name != "server")
        answer.headers.emplace_back(field.substr(0, colon), value);
    }
    size_t pos = end + 4;
    if (chunked) {
      Dechunker d;
      if (d.Feed(in, &pos, &answer.body, options.max_body + (64 << 20)) != Dechunker::kDone)
        return Error(502, "the sidecar's HTTP front end answered a malformed body");
    } else {
      answer.body = in.substr(pos, length == std::string::npos ? std::string::npos : length);
    }
    return answer;
  }
};

HttpServer::HttpServer(HttpOptions options, Take take, Gone gone) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->take = std::move(take);
  impl_->gone = std::move(gone);
  impl_->Start();
}

HttpServer::~HttpServer() = default;

int HttpServer::port() const { return impl_->port; }

void HttpServer::Respond(uint64_t connection, HttpResponse response) { impl_->Push(connection, std::move(response)); }

void HttpServer::Stop() { impl_->Stop(); }

}  // namespace accscale
