// The native edge (issue 45): the sidecar's public gRPC port, served in C++ on gRPC's own threads, and its HTTP port
// (http_server.cc, one epoll thread).
//
// Every call arrives through one generic callback service, as bytes:
// - ModelInfer and ModelStreamInfer are parsed here, and each request becomes an arrival record that Python
//   takes in bulk (Edge::take: one call into Python for many requests, the GIL released while it waits). Python
//   decides and serves as before and hands back each request's outputs (Edge::answer) or its error (Edge::fail);
//   the response is built, serialized and written here. A call the client cancels becomes a cancel record.
// - Every other method (health, metadata, config, admin) is passed as it came to the Python front end on a
//   Unix socket, and its answer passed back: one implementation of what those say, the Python one.
// - HTTP's inference requests (POST /v2/models/{m}[/versions/{v}]/infer) become arrival records as gRPC's do. A
//   request whose inputs all travel in the binary tail (tritonclient's and perf_analyzer's binary mode) is taken
//   apart here. Any other (JSON "data", or anything this fast path does not recognize, malformed bodies included)
//   crosses whole, and the Python front end's parser reads it: one implementation of the JSON value rules and of
//   the error messages, as typed gRPC contents cross whole. Every other HTTP request goes to the Python front end.
// Time spent here before Python sees a request counts against its slack: each record carries its arrival time on
// CLOCK_MONOTONIC (the sidecar's clock) and the time the client's deadline left it then.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <cmath>
#include <variant>

#include "grpc_service.grpc.pb.h"
#include "http_server.h"

namespace py = pybind11;
using accscale::HttpRequest;
using accscale::HttpResponse;
using accscale::HttpServer;
using inference::GRPCInferenceService;

namespace {

constexpr char kInfer[] = "/inference.GRPCInferenceService/ModelInfer";
constexpr char kStream[] = "/inference.GRPCInferenceService/ModelStreamInfer";
constexpr char kErrorKey[] = "accscale-error";  // as grpc_frontend.ERROR_METADATA

int64_t MonotonicUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool Parse(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  grpc::Slice slice;
  if (!buffer.DumpToSingleSlice(&slice).ok()) return false;
  return message->ParseFromArray(slice.begin(), static_cast<int>(slice.size()));
}

// Python values as KServe parameters, as the Python worker sets them: bool, int, float, else their str.
void SetParameters(google::protobuf::Map<std::string, inference::InferParameter>* out, const py::dict& parameters) {
  for (auto item : parameters) {
    auto& p = (*out)[py::cast<std::string>(item.first)];
    py::handle v = item.second;
    if (py::isinstance<py::bool_>(v)) p.set_bool_param(v.cast<bool>());
    else if (py::isinstance<py::int_>(v)) p.set_int64_param(v.cast<int64_t>());
    else if (py::isinstance<py::float_>(v)) p.set_double_param(v.cast<double>());
    else p.set_string_param(py::str(v).cast<std::string>());
  }
}

grpc::ByteBuffer Serialize(const google::protobuf::Message& message) {
  std::string bytes = message.SerializeAsString();
  grpc::Slice slice(std::move(bytes));
  return grpc::ByteBuffer(&slice, 1);
}

// Work the Python thread hands off: starting a gRPC write or call runs the transport (its syscalls) on the thread
// that starts it, and on the event loop's thread that cost held up every other request. One thread takes what is
// queued in bursts (one wake-up for many answers) and starts each in order.
class Outbox {
 public:
  Outbox() : thread_([this] { Run(); }) {}
  ~Outbox() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }

  void Post(std::function<void()> work) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      wake = queue_.empty() && !running_;
      queue_.push_back(std::move(work));
    }
    if (wake) ready_.notify_one();
  }

 private:
  void Run() {
    pthread_setname_np(pthread_self(), "edge-outbox");  // as top -H and /proc name it
    std::vector<std::function<void()>> batch;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ready_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped, and everything posted has run
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
      running_ = true;
      lock.unlock();
      for (auto& work : batch) work();
      batch.clear();
      lock.lock();
      running_ = false;
    }
  }

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;  // the thread is working through a batch: it looks at the queue again before it waits
  bool stopped_ = false;
  std::thread thread_;
};

// What the HTTP fast path reads of a request's JSON header.
using Param = std::variant<bool, int64_t, uint64_t, double, std::string>;
struct HttpInput {
  std::string name, datatype;
  std::vector<int64_t> shape;
  size_t offset = 0, size = 0;  // its bytes in the body
};
struct HttpInfer {
  std::string model, version;
  std::string body;                 // the whole body: the inputs' bytes are slices of it
  std::optional<std::string> header_length;  // Inference-Header-Content-Length, as sent
  bool whole = true;                // the fast path did not read it: Python's parser reads the body
  std::optional<std::string> id;
  std::vector<std::pair<std::string, Param>> parameters;
  std::vector<HttpInput> inputs;
  std::optional<std::vector<std::pair<std::string, int>>> outputs;  // binary_data: -1 not given, 0, 1
};

// One request as Python takes it. kind: 0 a gRPC request to serve, 1 its call was cancelled, 2 an HTTP request.
struct Arrival {
  uint64_t id = 0;
  int kind = 0;
  int64_t arrival_us = 0;
  int64_t remaining_us = -1;  // what the client's deadline left at arrival; -1: none
  inference::ModelInferRequest request;
  std::unique_ptr<HttpInfer> http;
};

constexpr int kServe = 0, kCancelled = 1, kHttp = 2;

// "/v2/models/{model}[/versions/{version}]/infer", percent-decoded as the Python front end's router reads it; false
// for any other path (the Python front end answers it, 404 included)
bool InferPath(const std::string& path, std::string* model, std::string* version) {
  std::vector<std::string> parts;
  size_t at = 1;
  if (path.empty() || path[0] != '/') return false;
  for (;;) {
    size_t slash = path.find('/', at);
    parts.push_back(path.substr(at, slash == std::string::npos ? std::string::npos : slash - at));
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
  if (parts.size() != 4 && parts.size() != 6) return false;
  if (parts[0] != "v2" || parts[1] != "models" || parts.back() != "infer") return false;
  if (parts.size() == 6 && parts[3] != "versions") return false;
  auto decode = [](const std::string& in, std::string* out) {
    out->clear();
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i] != '%') {
        out->push_back(in[i]);
        continue;
      }
      if (i + 2 >= in.size() || !std::isxdigit(static_cast<unsigned char>(in[i + 1])) ||
          !std::isxdigit(static_cast<unsigned char>(in[i + 2])))
        return false;
      out->push_back(static_cast<char>(std::stoi(in.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    }
    // what the router would not match as one segment goes to it to decide
    return !out->empty() && out->find_first_of("/{}") == std::string::npos;
  };
  if (!decode(parts[2], model)) return false;
  version->clear();
  return parts.size() == 4 || decode(parts[4], version);
}

// Whether `s` is UTF-8 (what a Python str can be made of); the router reads a path that is not as no route.
bool Utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    i += n;
  }
  return true;
}

// The deepest nesting of arrays and objects in a JSON text (strings skipped). Python's parser refuses a text past
// its recursion limit (about 1,000 levels) with "nested too deeply"; the fast path leaves such a text to it.
size_t Depth(const char* text, size_t size) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < size; ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

constexpr size_t kMaxFastDepth = 64;  // a header from tritonclient nests 4 levels

using Json = rapidjson::Value;

// the last member called `name`: Python's json keeps the last of repeated keys
const Json* Member(const Json& object, const char* name) {
  const Json* found = nullptr;
  for (auto it = object.MemberBegin(); it != object.MemberEnd(); ++it)
    if (it->name == name) found = &it->value;
  return found;
}

std::string Str(const Json& v) { return std::string(v.GetString(), v.GetStringLength()); }

// The fast path: true when every part of the header is of the plain shape tritonclient's binary mode sends, and
// every input's bytes are in the tail. Checking a value against the model stays Python's (parse_request); this
// only takes the wire format apart, and declines (false) wherever Python's reading could differ from it.
bool ReadBinary(HttpInfer* r) {
  size_t header = r->body.size();
  if (r->header_length) {
    const std::string& s = *r->header_length;
    if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    header = std::stoull(s);
    if (header == 0 || header > r->body.size()) return false;
  }
  if (Depth(r->body.data(), header) > kMaxFastDepth) return false;
  rapidjson::Document d;
  // iterative: no nesting depth reaches the stack; encoding checked as Python's decoder would; numbers rounded as
  // Python's float() rounds them
  d.Parse<rapidjson::kParseIterativeFlag | rapidjson::kParseValidateEncodingFlag | rapidjson::kParseFullPrecisionFlag>(
      r->body.data(), header);
  if (d.HasParseError() || !d.IsObject()) return false;
  if (const Json* id = Member(d, "id"); id && !id->IsNull()) {
    if (!id->IsString()) return false;
    r->id = Str(*id);
  }
  if (const Json* params = Member(d, "parameters")) {
    if (!params->IsObject()) return false;
    for (auto it = params->MemberBegin(); it != params->MemberEnd(); ++it) {
      const Json& v = it->value;
      Param p;
      if (v.IsBool()) p = v.GetBool();
      else if (v.IsInt64()) p = v.GetInt64();
      else if (v.IsUint64()) p = v.GetUint64();
      // an integer past 64 bits, which this parser holds as a double and Python as an int: Python reads it
      else if (v.IsDouble() && std::isfinite(v.GetDouble()) && std::fabs(v.GetDouble()) < 9.2e18) p = v.GetDouble();
      else if (v.IsString()) p = Str(v);
      else return false;
      r->parameters.emplace_back(Str(it->name), std::move(p));
    }
  }
  const Json* inputs = Member(d, "inputs");
  if (!inputs || !inputs->IsArray()) return false;
  size_t tail = r->body.size() - header, offset = 0;
  for (const Json& t : inputs->GetArray()) {
    if (!t.IsObject()) return false;
    const Json *name = Member(t, "name"), *datatype = Member(t, "datatype"), *shape = Member(t, "shape"),
               *params = Member(t, "parameters");
    if (!name || !name->IsString() || !datatype || !datatype->IsString() || !shape || !shape->IsArray()) return false;
    if (!params || !params->IsObject()) return false;
    const Json* size = Member(*params, "binary_data_size");
    if (!size || !size->IsUint64() || size->GetUint64() > tail - offset) return false;
    HttpInput in{Str(*name), Str(*datatype), {}, header + offset, static_cast<size_t>(size->GetUint64())};
    for (const Json& dim : shape->GetArray()) {
      if (!dim.IsInt64()) return false;
      in.shape.push_back(dim.GetInt64());
    }
    offset += in.size;
    r->inputs.push_back(std::move(in));
  }
  if (offset != tail) return false;
  if (const Json* outputs = Member(d, "outputs"); outputs && !outputs->IsNull()) {
    if (!outputs->IsArray()) return false;
    r->outputs.emplace();
    for (const Json& o : outputs->GetArray()) {
      if (!o.IsObject()) return false;
      const Json* name = Member(o, "name");
      if (!name || !name->IsString()) return false;
      int binary = -1;
      if (const Json* params = Member(o, "parameters")) {
        if (!params->IsObject()) return false;
        if (const Json* b = Member(*params, "binary_data"); b && !b->IsNull()) {
          if (!b->IsBool()) return false;
          binary = b->GetBool();
        }
      }
      r->outputs->emplace_back(Str(*name), binary);
    }
  }
  return true;
}

// Python's parameter values in JSON, as json.dumps writes them
void WriteValue(rapidjson::Writer<rapidjson::StringBuffer>* w, py::handle v) {
  if (py::isinstance<py::bool_>(v)) {
    w->Bool(v.cast<bool>());
  } else if (py::isinstance<py::int_>(v)) {
    std::string digits = py::str(v).cast<std::string>();
    w->RawValue(digits.data(), digits.size(), rapidjson::kNumberType);
  } else if (py::isinstance<py::float_>(v)) {
    double x = v.cast<double>();
    if (std::isfinite(x)) w->Double(x);
    else w->RawValue(std::isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity", std::isnan(x) ? 3 : x > 0 ? 8 : 9,
                     rapidjson::kNumberType);
  } else {
    std::string text = py::str(v).cast<std::string>();
    w->String(text.data(), static_cast<rapidjson::SizeType>(text.size()));
  }
}

class Edge;
class Call;

// What an answer reaches its call through: null once the call has ended (OnDone), so a late answer is dropped
// instead of touching a call that is gone.
struct CallRef {
  std::recursive_mutex mu;
  Call* call;
};

// One client call: a unary ModelInfer, a ModelStreamInfer stream, or a call passed to the Python front end.
// Lives until OnDone. Python's answers reach it through Edge, which finds it by request id under its own lock.
class Call final : public grpc::ServerGenericBidiReactor {
 public:
  enum class Kind { kInfer, kStream, kForward };

  Call(Edge* edge, grpc::GenericCallbackServerContext* ctx, Kind kind)
      : edge_(edge), ctx_(ctx), kind_(kind), ref_(std::make_shared<CallRef>()) {
    ref_->call = this;
    StartRead(&in_);
  }

  const std::shared_ptr<CallRef>& ref() const { return ref_; }

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // Python's answer to request `id` of this call (called with no lock of Edge held).
  void Respond(uint64_t id, inference::ModelInferResponse* response, const grpc::Status* error,
               const std::string& error_class);

 private:
  void Forward();
  void WriteLocked(grpc::ByteBuffer buffer);
  void MaybeFinishStreamLocked();

  Edge* const edge_;
  grpc::GenericCallbackServerContext* const ctx_;
  const Kind kind_;
  const std::shared_ptr<CallRef> ref_;
  grpc::ByteBuffer in_;
  std::recursive_mutex mu_;
  std::unordered_set<uint64_t> pending_;  // requests handed to Python and not answered yet
  std::deque<grpc::ByteBuffer> writes_;   // a stream's answers not yet written
  bool writing_ = false;
  bool reads_done_ = false;
  bool finished_ = false;
  // a forwarded call's own client side
  grpc::ClientContext forward_ctx_;
  grpc::ByteBuffer forward_out_;
};

class Edge {
  // where a request handed to Python is answered
  struct Pending {
    std::shared_ptr<CallRef> call;  // gRPC
    bool http = false;
    uint64_t connection = 0;        // HTTP
    std::string model, version, request_id;
  };

 public:
  Edge(const std::string& address, const std::string& forward_to, int max_request_bytes,
       const std::string& model_version, const std::string& http_host, int http_port,
       const std::string& http_forward_to, int read_timeout_ms, int idle_timeout_ms)
      : model_version_(model_version) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    forward_ = std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(forward_to, grpc::InsecureChannelCredentials(), args));
    service_ = std::make_unique<Service>(this);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
    builder.SetMaxReceiveMessageSize(max_request_bytes);
    builder.SetMaxSendMessageSize(-1);
    builder.RegisterCallbackGenericService(service_.get());
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) throw std::runtime_error("the native edge cannot bind " + address);
    ready_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ready_fd_ < 0) throw std::runtime_error("eventfd failed");
    if (http_port >= 0) {
      accscale::HttpOptions options;
      options.host = http_host;
      options.port = http_port;
      options.max_body = static_cast<size_t>(max_request_bytes);
      options.read_timeout_ms = read_timeout_ms;
      options.idle_timeout_ms = idle_timeout_ms;
      options.forward_to = http_forward_to;
      try {
        http_ = std::make_unique<HttpServer>(
            options, [this](uint64_t connection, HttpRequest& r) { return TakeHttp(connection, r); },
            [this](uint64_t connection) { HttpGone(connection); });
      } catch (...) {  // no destructor runs for an object whose constructor throws: what it started stops here
        server_->Shutdown(std::chrono::system_clock::now());
        close(ready_fd_);
        throw;
      }
    }
  }

  ~Edge() {
    Stop();
    close(ready_fd_);
  }

  // Readable while requests wait to be taken: an event loop watches it (add_reader) and takes them with no wait,
  // on its own thread, so no second Python thread contends for the GIL.
  int fd() const { return ready_fd_; }

  int port() const { return port_; }
  int http_port() const { return http_ ? http_->port() : -1; }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    ready_.notify_all();
    if (http_) http_->Stop();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  // Requests and cancellations since the last take, at most `limit`, waiting up to `timeout_ms` for the first.
  py::list Take(size_t limit, int timeout_ms) {
    std::vector<std::unique_ptr<Arrival>> got;
    {
      std::optional<py::gil_scoped_release> unlocked;
      if (timeout_ms > 0) unlocked.emplace();
      std::unique_lock<std::mutex> lock(mu_);
      if (timeout_ms > 0)
        ready_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return stopped_ || !queue_.empty(); });
      while (!queue_.empty() && got.size() < limit) {
        got.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      uint64_t drained;
      if (queue_.empty() && signalled_) {
        signalled_ = false;
        [[maybe_unused]] ssize_t n = read(ready_fd_, &drained, sizeof drained);
      }
    }
    py::list out;
    for (auto& a : got) {
      try {
        out.append(ToPython(*a));
      } catch (const std::exception& e) {  // a value Python cannot hold: this request fails, the others go on
        if (a->kind != kCancelled)
          Fail(a->id, static_cast<int>(grpc::StatusCode::INTERNAL), 500,
               std::string("the request could not be handed to the scheduler: ") + e.what(), "InternalError");
      }
    }
    return out;
  }

  void Answer(uint64_t id, const py::list& outputs, const py::dict& parameters) {
    // the response is built before the request is claimed: a value that cannot be converted raises here, and the
    // request is still pending for Python to fail
    inference::ModelInferResponse response;
    SetParameters(response.mutable_parameters(), parameters);
    for (auto item : outputs) {
      auto t = item.cast<py::tuple>();  // (name, datatype, shape, raw bytes)
      auto* out = response.add_outputs();
      out->set_name(t[0].cast<std::string>());
      out->set_datatype(t[1].cast<std::string>());
      for (auto d : t[2].cast<py::list>()) out->add_shape(d.cast<int64_t>());
      char* data;
      Py_ssize_t size;
      if (PyBytes_AsStringAndSize(t[3].ptr(), &data, &size) != 0) throw py::error_already_set();
      response.add_raw_output_contents(data, static_cast<size_t>(size));
    }
    std::shared_ptr<Pending> pending = Claim(id);
    if (!pending) return;  // the client left, or the call ended
    response.set_model_name(pending->model);
    response.set_model_version(pending->version);
    response.set_id(pending->request_id);
    auto answer = std::make_shared<inference::ModelInferResponse>(std::move(response));
    py::gil_scoped_release unlocked;
    outbox_.Post([id, pending, answer] {
      std::lock_guard<std::recursive_mutex> lock(pending->call->mu);
      if (pending->call->call) pending->call->call->Respond(id, answer.get(), nullptr, "");
    });
  }

  void Fail(uint64_t id, int code, int http_status, const std::string& message, const std::string& error_class) {
    std::shared_ptr<Pending> pending = Claim(id);
    if (!pending) return;
    if (pending->http) {
      HttpResponse r;
      r.status = http_status;
      r.headers.emplace_back("Content-Type", "application/json");
      r.body = accscale::JsonError(message);
      py::gil_scoped_release unlocked;
      http_->Respond(pending->connection, std::move(r));
      return;
    }
    inference::ModelInferResponse response;  // a stream's error names its request
    response.set_model_name(pending->model);
    response.set_model_version(pending->version);
    response.set_id(pending->request_id);
    auto answer = std::make_shared<inference::ModelInferResponse>(std::move(response));
    grpc::Status status(static_cast<grpc::StatusCode>(code), message);
    py::gil_scoped_release unlocked;
    outbox_.Post([id, pending, answer, status, error_class] {
      std::lock_guard<std::recursive_mutex> lock(pending->call->mu);
      if (pending->call->call) pending->call->call->Respond(id, answer.get(), &status, error_class);
    });
  }

  // An HTTP request's answer: outputs are (name, datatype, shape, raw bytes or None, JSON text of its data or None);
  // an output with bytes travels in the binary tail, one with JSON text as "data".
  void AnswerHttp(uint64_t id, const py::list& outputs, const py::dict& parameters, const py::object& request_id) {
    std::shared_ptr<Pending> pending = Find(id);
    if (!pending) return;
    rapidjson::StringBuffer text;
    rapidjson::Writer<rapidjson::StringBuffer> w(text);
    std::string tail;
    w.StartObject();
    w.Key("model_name");
    w.String(pending->model.data(), static_cast<rapidjson::SizeType>(pending->model.size()));
    w.Key("model_version");
    w.String(pending->version.data(), static_cast<rapidjson::SizeType>(pending->version.size()));
    if (!request_id.is_none()) {
      std::string rid = request_id.cast<std::string>();
      w.Key("id");
      w.String(rid.data(), static_cast<rapidjson::SizeType>(rid.size()));
    }
    w.Key("parameters");
    w.StartObject();
    for (auto item : parameters) {
      std::string key = py::str(item.first).cast<std::string>();
      w.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
      WriteValue(&w, item.second);
    }
    w.EndObject();
    w.Key("outputs");
    w.StartArray();
    for (auto item : outputs) {
      auto t = item.cast<py::tuple>();
      std::string name = t[0].cast<std::string>(), datatype = t[1].cast<std::string>();
      w.StartObject();
      w.Key("name");
      w.String(name.data(), static_cast<rapidjson::SizeType>(name.size()));
      w.Key("datatype");
      w.String(datatype.data(), static_cast<rapidjson::SizeType>(datatype.size()));
      w.Key("shape");
      w.StartArray();
      for (auto dim : t[2].cast<py::list>()) w.Int64(dim.cast<int64_t>());
      w.EndArray();
      if (!t[3].is_none()) {
        char* data;
        Py_ssize_t size;
        if (PyBytes_AsStringAndSize(t[3].ptr(), &data, &size) != 0) throw py::error_already_set();
        w.Key("parameters");
        w.StartObject();
        w.Key("binary_data_size");
        w.Uint64(static_cast<uint64_t>(size));
        w.EndObject();
        tail.append(data, static_cast<size_t>(size));
      } else {
        std::string data = t[4].cast<std::string>();
        w.Key("data");
        w.RawValue(data.data(), data.size(), rapidjson::kArrayType);
      }
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
    pending = Claim(id);
    if (!pending) return;  // the client left meanwhile
    HttpResponse r;
    if (tail.empty()) {
      r.headers.emplace_back("Content-Type", "application/json");
      r.body.assign(text.GetString(), text.GetSize());
    } else {
      r.headers.emplace_back("Content-Type", "application/octet-stream");
      r.headers.emplace_back("Inference-Header-Content-Length", std::to_string(text.GetSize()));
      r.body.reserve(text.GetSize() + tail.size());
      r.body.assign(text.GetString(), text.GetSize());
      r.body += tail;
    }
    py::gil_scoped_release unlocked;
    http_->Respond(pending->connection, std::move(r));
  }

  py::dict Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    py::dict d;
    d["arrivals"] = arrivals_;
    d["forwarded"] = forwarded_.load();
    d["pending"] = pending_.size();
    return d;
  }

  // ---- for Call
  void Arrive(Call* call, std::unique_ptr<Arrival> a) {
    auto pending = std::make_shared<Pending>();
    pending->call = call->ref();
    pending->model = a->request.model_name();
    pending->version = model_version_;
    pending->request_id = a->request.id();
    Queue(std::move(pending), std::move(a));
  }

  // ---- for the HTTP server (on its I/O thread)
  bool TakeHttp(uint64_t connection, HttpRequest& request) {
    if (request.method != "POST") return false;  // decided before anything is allocated: most routes are GETs
    auto r = std::make_unique<HttpInfer>();
    if (!InferPath(request.path, &r->model, &r->version)) return false;
    if (!Utf8(r->model) || !Utf8(r->version)) return false;
    auto a = std::make_unique<Arrival>();
    a->arrival_us = MonotonicUs();
    a->kind = kHttp;
    a->id = NextId();
    r->body = std::move(request.body);
    if (const std::string* length = request.Header("inference-header-content-length")) r->header_length = *length;
    r->whole = !ReadBinary(r.get());
    auto pending = std::make_shared<Pending>();
    pending->http = true;
    pending->connection = connection;
    pending->model = r->model;
    pending->version = model_version_;
    a->http = std::move(r);
    {
      std::lock_guard<std::mutex> lock(mu_);
      http_waiting_[connection] = a->id;
    }
    Queue(std::move(pending), std::move(a));
    return true;
  }

  void HttpGone(uint64_t connection) {
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = http_waiting_.find(connection);
      if (it == http_waiting_.end()) return;
      id = it->second;
      http_waiting_.erase(it);
    }
    Withdraw({id});
  }

  void Queue(std::shared_ptr<Pending> pending, std::unique_ptr<Arrival> a) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.emplace(a->id, std::move(pending));
      queue_.push_back(std::move(a));
      ++arrivals_;
      SignalLocked();
    }
    ready_.notify_one();
  }

  // The call ended before Python answered `ids`: they are withdrawn, and Python is told.
  void Withdraw(const std::unordered_set<uint64_t>& ids) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (uint64_t id : ids) {
        if (pending_.erase(id) == 0) continue;
        auto a = std::make_unique<Arrival>();
        a->id = id;
        a->kind = 1;
        queue_.push_back(std::move(a));
      }
      if (!queue_.empty()) SignalLocked();
    }
    ready_.notify_one();
  }

  uint64_t NextId() { return next_id_.fetch_add(1, std::memory_order_relaxed); }
  grpc::GenericStub* forward() { return forward_.get(); }
  void Forwarded() { forwarded_.fetch_add(1, std::memory_order_relaxed); }

 private:

  class Service final : public grpc::CallbackGenericService {
   public:
    explicit Service(Edge* edge) : edge_(edge) {}
    grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
      const std::string& method = ctx->method();
      Call::Kind kind = method == kInfer ? Call::Kind::kInfer
                        : method == kStream ? Call::Kind::kStream
                                            : Call::Kind::kForward;
      return new Call(edge_, ctx, kind);
    }

   private:
    Edge* edge_;
  };

  void SignalLocked() {
    if (signalled_) return;
    signalled_ = true;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(ready_fd_, &one, sizeof one);
  }

  std::shared_ptr<Pending> Claim(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return nullptr;
    auto pending = std::move(it->second);
    pending_.erase(it);
    if (pending->http) http_waiting_.erase(pending->connection);
    return pending;
  }

  std::shared_ptr<Pending> Find(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(id);
    return it == pending_.end() ? nullptr : it->second;
  }

  // (id, 2, model, version, request id, parameters, inputs, outputs, arrival, body, header length): inputs and
  // the rest as the fast path read them and body None, or body the whole body and what it read None
  static py::tuple HttpToPython(const Arrival& a) {
    const HttpInfer& r = *a.http;
    // a header's bytes as latin-1, so that any value crosses (the Python parser says it is no integer)
    auto length = r.header_length ? py::reinterpret_steal<py::object>(PyUnicode_DecodeLatin1(
                                        r.header_length->data(), static_cast<Py_ssize_t>(r.header_length->size()),
                                        nullptr))
                                  : py::object(py::none());
    if (r.whole)
      return py::make_tuple(a.id, kHttp, r.model, r.version, py::none(), py::none(), py::none(), py::none(),
                            a.arrival_us, py::bytes(r.body), length);
    py::dict params;
    for (const auto& [key, value] : r.parameters)
      std::visit([&](const auto& v) { params[py::str(key)] = v; }, value);
    py::list inputs;
    for (const auto& t : r.inputs)
      inputs.append(py::make_tuple(t.name, t.datatype, py::cast(t.shape), py::bytes(r.body.data() + t.offset, t.size)));
    py::object outputs = py::none();
    if (r.outputs) {
      py::list named;
      for (const auto& [name, binary] : *r.outputs)
        named.append(py::make_tuple(name, binary < 0 ? py::object(py::none()) : py::object(py::bool_(binary == 1))));
      outputs = named;
    }
    auto id = r.id ? py::object(py::str(*r.id)) : py::object(py::none());
    return py::make_tuple(a.id, kHttp, r.model, r.version, id, params, inputs, outputs, a.arrival_us, py::none(),
                          length);
  }

  static py::tuple ToPython(const Arrival& a) {
    if (a.kind == kCancelled) return py::make_tuple(a.id, kCancelled);
    if (a.kind == kHttp) return HttpToPython(a);
    const auto& r = a.request;
    py::dict params;
    for (const auto& [key, p] : r.parameters()) {
      switch (p.parameter_choice_case()) {
        case inference::InferParameter::kBoolParam: params[py::str(key)] = p.bool_param(); break;
        case inference::InferParameter::kInt64Param: params[py::str(key)] = p.int64_param(); break;
        case inference::InferParameter::kUint64Param: params[py::str(key)] = p.uint64_param(); break;
        case inference::InferParameter::kDoubleParam: params[py::str(key)] = p.double_param(); break;
        case inference::InferParameter::kStringParam: params[py::str(key)] = p.string_param(); break;
        default: break;
      }
    }
    py::list outputs;
    for (const auto& o : r.outputs()) outputs.append(o.name());
    // raw contents are the common case and cross as bytes; a request with typed contents crosses whole, and
    // Python's own parser reads it (one implementation of the typed-contents rules)
    bool raw = r.raw_input_contents_size() > 0;
    py::list inputs;
    if (raw) {
      if (r.raw_input_contents_size() != r.inputs_size()) {
        py::object typed = py::bytes(r.SerializeAsString());
        return py::make_tuple(a.id, 0, r.model_name(), r.model_version(), r.id(), params, py::none(), outputs,
                              a.remaining_us, a.arrival_us, typed);
      }
      for (int i = 0; i < r.inputs_size(); ++i) {
        const auto& t = r.inputs(i);
        py::list shape;
        for (auto d : t.shape()) shape.append(d);
        const std::string& bytes = r.raw_input_contents(i);
        inputs.append(py::make_tuple(t.name(), t.datatype(), shape, py::bytes(bytes.data(), bytes.size())));
      }
      return py::make_tuple(a.id, 0, r.model_name(), r.model_version(), r.id(), params, inputs, outputs,
                            a.remaining_us, a.arrival_us, py::none());
    }
    return py::make_tuple(a.id, 0, r.model_name(), r.model_version(), r.id(), params, py::none(), outputs,
                          a.remaining_us, a.arrival_us, py::bytes(r.SerializeAsString()));
  }

  const std::string model_version_;  // every answer's (the sidecar serves one version of each model)
  std::unique_ptr<grpc::GenericStub> forward_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::unique_ptr<Arrival>> queue_;
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending_;
  uint64_t arrivals_ = 0;
  std::atomic<uint64_t> forwarded_{0};
  std::unordered_map<uint64_t, uint64_t> http_waiting_;  // an HTTP connection -> the request it waits on
  std::atomic<uint64_t> next_id_{0};
  bool stopped_ = false;
  int ready_fd_ = -1;
  bool signalled_ = false;  // ready_fd_ holds a count: a burst of arrivals costs one wake-up
  Outbox outbox_;  // destroyed before the servers, once they have stopped
  std::unique_ptr<HttpServer> http_;  // last: destroyed first (its threads call into this Edge)
};

void Call::OnReadDone(bool ok) {
  if (kind_ == Kind::kForward) {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message"));
      return;
    }
    Forward();
    return;
  }
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (finished_) return;  // the call has ended (a broken stream, a cancel): nothing more is read or written
  if (!ok) {  // the client has sent its last request (a stream), or none at all
    reads_done_ = true;
    if (kind_ == Kind::kInfer && pending_.empty() && !finished_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message"));
    } else {
      MaybeFinishStreamLocked();
    }
    return;
  }
  auto a = std::make_unique<Arrival>();
  a->arrival_us = MonotonicUs();
  auto deadline = ctx_->deadline();
  if (deadline != std::chrono::system_clock::time_point::max() && kind_ == Kind::kInfer) {
    a->remaining_us = std::chrono::duration_cast<std::chrono::microseconds>(
                          deadline - std::chrono::system_clock::now()).count();
  }
  if (!Parse(in_, &a->request)) {
    grpc::Status bad(grpc::StatusCode::INVALID_ARGUMENT, "the request is not a ModelInferRequest");
    if (kind_ == Kind::kInfer) {
      finished_ = true;
      Finish(bad);
    } else {
      inference::ModelStreamInferResponse answer;
      answer.set_error_message(bad.error_message());
      WriteLocked(Serialize(answer));
      StartRead(&in_);
    }
    return;
  }
  a->id = edge_->NextId();
  pending_.insert(a->id);
  edge_->Arrive(this, std::move(a));
  if (kind_ == Kind::kStream) StartRead(&in_);  // a unary call has its one request
}

void Call::Forward() {
  edge_->Forwarded();
  auto deadline = ctx_->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) forward_ctx_.set_deadline(deadline);
  edge_->forward()->UnaryCall(&forward_ctx_, ctx_->method(), grpc::StubOptions(), &in_, &forward_out_,
                              [this](grpc::Status status) {
                                if (status.ok()) StartWriteAndFinish(&forward_out_, grpc::WriteOptions(), status);
                                else Finish(status);
                              });
}

void Call::Respond(uint64_t id, inference::ModelInferResponse* response, const grpc::Status* error,
                   const std::string& error_class) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (finished_ || pending_.erase(id) == 0) return;
  if (kind_ == Kind::kInfer) {
    finished_ = true;
    if (error) {
      ctx_->AddTrailingMetadata(kErrorKey, error_class);
      Finish(*error);
    } else {
      writes_.push_back(Serialize(*response));
      StartWriteAndFinish(&writes_.back(), grpc::WriteOptions(), grpc::Status::OK);
    }
    return;
  }
  inference::ModelStreamInferResponse answer;
  if (error) answer.set_error_message(error->error_message());
  answer.mutable_infer_response()->Swap(response);
  WriteLocked(Serialize(answer));
}

void Call::WriteLocked(grpc::ByteBuffer buffer) {
  writes_.push_back(std::move(buffer));
  if (!writing_) {
    writing_ = true;
    StartWrite(&writes_.front());
  }
}

void Call::OnWriteDone(bool ok) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (kind_ != Kind::kStream) return;
  writes_.pop_front();
  writing_ = false;
  if (!ok) {  // the stream is broken: nothing more can be written
    if (!finished_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream broke"));
    }
    return;
  }
  if (!writes_.empty()) {
    writing_ = true;
    StartWrite(&writes_.front());
    return;
  }
  MaybeFinishStreamLocked();
}

void Call::MaybeFinishStreamLocked() {
  if (kind_ == Kind::kStream && reads_done_ && pending_.empty() && !writing_ && writes_.empty() && !finished_) {
    finished_ = true;
    Finish(grpc::Status::OK);
  }
}

void Call::OnCancel() {
  std::unordered_set<uint64_t> withdrawn;
  {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    withdrawn.swap(pending_);
    // nothing will answer this call now: it ends here (a write in flight ends it in OnWriteDone), or it would never
    // be done and the server's shutdown would wait for it for ever
    if (kind_ != Kind::kForward && !finished_ && !writing_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
    }
  }
  if (kind_ == Kind::kForward) forward_ctx_.TryCancel();
  if (!withdrawn.empty()) edge_->Withdraw(withdrawn);
}

void Call::OnDone() {
  std::unordered_set<uint64_t> withdrawn;
  {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    withdrawn.swap(pending_);
    finished_ = true;
  }
  if (!withdrawn.empty()) edge_->Withdraw(withdrawn);
  {
    std::lock_guard<std::recursive_mutex> lock(ref_->mu);
    ref_->call = nullptr;
  }
  delete this;
}

// Triton's ModelInfer from C++: the sidecar's batches, sent on gRPC's threads, their answers queued for the event
// loop as the edge's requests are (an eventfd, taken in bursts). No Python gRPC runs on the data path.
class Client {
 public:
  Client() {
    ready_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ready_fd_ < 0) throw std::runtime_error("eventfd failed");
  }
  ~Client() { close(ready_fd_); }

  int fd() const { return ready_fd_; }

  // One batch: inputs are (name, datatype, shape, [row bytes, ...]) and are concatenated here; parameters as the
  // Python worker sets them (bool, int, float, else str).
  void Infer(uint64_t token, const std::string& url, const std::string& model, const std::string& version,
             const py::list& inputs, const py::dict& parameters, int64_t timeout_us) {
    auto call = std::make_unique<Pending>();
    call->token = token;
    auto& r = call->request;
    r.set_model_name(model);
    r.set_model_version(version);
    for (auto item : inputs) {
      auto t = item.cast<py::tuple>();
      auto* in = r.add_inputs();
      in->set_name(t[0].cast<std::string>());
      in->set_datatype(t[1].cast<std::string>());
      for (auto d : t[2].cast<py::list>()) in->add_shape(d.cast<int64_t>());
      std::string* raw = r.add_raw_input_contents();
      for (auto row : t[3]) {
        char* data;
        Py_ssize_t size;
        if (PyBytes_AsStringAndSize(row.ptr(), &data, &size) != 0) throw py::error_already_set();
        raw->append(data, static_cast<size_t>(size));
      }
    }
    SetParameters(r.mutable_parameters(), parameters);
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(timeout_us));
    py::gil_scoped_release unlocked;
    Worker& worker = WorkerFor(url);
    call->channel = worker.channel;
    Pending* raw = call.release();
    GRPCInferenceService::Stub* stub = worker.stub.get();
    outbox_.Post([this, stub, raw] { Start(stub, raw); });
  }

  // Finished batches: (token, status code, message, channel ready, [(output name, raw bytes), ...]).
  py::list Take(size_t limit) {
    std::vector<std::unique_ptr<Pending>> got;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!done_.empty() && got.size() < limit) {
        got.push_back(std::move(done_.front()));
        done_.pop_front();
      }
      if (done_.empty() && signalled_) {
        signalled_ = false;
        uint64_t drained;
        [[maybe_unused]] ssize_t n = read(ready_fd_, &drained, sizeof drained);
      }
    }
    py::list out;
    for (auto& c : got) {
      py::list outputs;
      const auto& resp = c->response;
      if (c->status.ok()) {
        if (resp.raw_output_contents_size() != resp.outputs_size()) {
          out.append(py::make_tuple(c->token, static_cast<int>(grpc::StatusCode::INTERNAL),
                                    "answered without raw output contents", c->ready, outputs));
          continue;
        }
        for (int i = 0; i < resp.outputs_size(); ++i) {
          const std::string& raw = resp.raw_output_contents(i);
          outputs.append(py::make_tuple(resp.outputs(i).name(), py::bytes(raw.data(), raw.size())));
        }
      }
      out.append(py::make_tuple(c->token, static_cast<int>(c->status.error_code()), c->status.error_message(),
                                c->ready, outputs));
    }
    return out;
  }

 private:
  struct Pending;

  // Runs on the outbox's thread.
  void Start(GRPCInferenceService::Stub* stub, Pending* raw) {
    stub->async()->ModelInfer(&raw->context, &raw->request, &raw->response, [this, raw](grpc::Status status) {
      std::unique_ptr<Pending> done(raw);
      done->status = std::move(status);
      done->ready = done->channel->GetState(false) == GRPC_CHANNEL_READY;
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(std::move(done));
      if (!signalled_) {
        signalled_ = true;
        uint64_t one = 1;
        [[maybe_unused]] ssize_t n = write(ready_fd_, &one, sizeof one);
      }
    });
  }

  struct Pending {
    uint64_t token = 0;
    grpc::ClientContext context;
    inference::ModelInferRequest request;
    inference::ModelInferResponse response;
    grpc::Status status;
    std::shared_ptr<grpc::Channel> channel;
    bool ready = false;
  };
  struct Worker {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<GRPCInferenceService::Stub> stub;
  };

  Worker& WorkerFor(const std::string& url) {
    std::lock_guard<std::mutex> lock(workers_mu_);
    auto& w = workers_[url];
    if (!w.stub) {
      grpc::ChannelArguments args;  // as live/workers.py's CHANNEL_OPTIONS
      args.SetMaxReceiveMessageSize(-1);
      args.SetMaxSendMessageSize(-1);
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      w.channel = grpc::CreateCustomChannel(url, grpc::InsecureChannelCredentials(), args);
      w.stub = GRPCInferenceService::NewStub(w.channel);
    }
    return w;
  }

  int ready_fd_ = -1;
  std::mutex mu_;
  std::deque<std::unique_ptr<Pending>> done_;
  bool signalled_ = false;
  std::mutex workers_mu_;
  std::unordered_map<std::string, Worker> workers_;
  Outbox outbox_;  // last: destroyed first
};

}  // namespace

PYBIND11_MODULE(_edge, m) {
  m.doc() = "The sidecar's native edge: gRPC and HTTP (native/edge.cc, native/http_server.cc)";
  py::class_<Edge>(m, "Edge")
      .def(py::init<const std::string&, const std::string&, int, const std::string&, const std::string&, int,
                    const std::string&, int, int>(),
           py::arg("address"), py::arg("forward_to"), py::arg("max_request_bytes"), py::arg("model_version"),
           py::arg("http_host") = "", py::arg("http_port") = -1, py::arg("http_forward_to") = "",
           py::arg("read_timeout_ms") = 10000, py::arg("idle_timeout_ms") = 60000)
      .def_property_readonly("port", &Edge::port)
      .def_property_readonly("http_port", &Edge::http_port)
      .def_property_readonly("fd", &Edge::fd)
      .def("take", &Edge::Take, py::arg("limit"), py::arg("timeout_ms"))
      .def("answer", &Edge::Answer, py::arg("id"), py::arg("outputs"), py::arg("parameters"))
      .def("answer_http", &Edge::AnswerHttp, py::arg("id"), py::arg("outputs"), py::arg("parameters"),
           py::arg("request_id"))
      .def("fail", &Edge::Fail, py::arg("id"), py::arg("code"), py::arg("http_status"), py::arg("message"),
           py::arg("error_class"))
      .def("stats", &Edge::Stats)
      .def("stop", &Edge::Stop, py::call_guard<py::gil_scoped_release>());
  py::class_<Client>(m, "Client")
      .def(py::init<>())
      .def_property_readonly("fd", &Client::fd)
      .def("infer", &Client::Infer, py::arg("token"), py::arg("url"), py::arg("model"), py::arg("version"),
           py::arg("inputs"), py::arg("parameters"), py::arg("timeout_us"))
      .def("take", &Client::Take, py::arg("limit"));
  m.def("monotonic_us", &MonotonicUs);
}
