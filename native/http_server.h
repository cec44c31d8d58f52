// HTTP/1.1 for the native edge: the transport only (connections, framing, limits, timeouts). What a request means
// is the edge's (edge.cc): it takes the requests it serves, and every other request is passed, as it came, to the
// Python front end on a Unix socket, whose answer is passed back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace accscale {

struct HttpRequest {
  std::string method;
  std::string target;  // as sent: the path and its query
  std::string path;    // the target without its query
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, in the order sent
  std::string body;    // whole (a chunked body decoded)
  bool keep_alive = true;

  // the last value of a header (lower-case name), or null
  const std::string* Header(const std::string& name) const {
    for (auto it = headers.rbegin(); it != headers.rend(); ++it)
      if (it->first == name) return &it->second;
    return nullptr;
  }
};

struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // Content-Length and Connection are added
  std::string body;
};

struct HttpOptions {
  std::string host;
  int port = 0;                  // 0: a free one
  size_t max_body = 64 << 20;    // larger bodies get 413, unread
  int read_timeout_ms = 10000;   // a body must arrive within this after its headers, else 408
  int idle_timeout_ms = 60000;   // an idle connection, or one whose headers do not finish, is closed
  std::string forward_to;        // the Unix socket of the Python front end
};

class HttpServer {
 public:
  // Called on the I/O thread for each whole request. True: it is taken, and answered later through Respond (from
  // any thread); false: it is passed to the Python front end.
  using Take = std::function<bool(uint64_t connection, HttpRequest& request)>;
  // A connection with a taken request not yet answered has closed: its answer has nowhere to go.
  using Gone = std::function<void(uint64_t connection)>;

  HttpServer(HttpOptions options, Take take, Gone gone);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // The answer to the request `connection` is waiting on; dropped if the connection has gone. Any thread.
  void Respond(uint64_t connection, HttpResponse response);
  void Stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// {"error": message}, as the Python front end answers errors
std::string JsonError(const std::string& message);

}  // namespace accscale
