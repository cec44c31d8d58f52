// The least a native gRPC front end costs per request: the C++ counterpart of grpc_floor.py, for
// `accscale bench sidecar --floor`, so the edge's technology is chosen by measurement (issue 45).
//
//   accscale-floor --port P --triton HOST:PORT --mode echo|proxy|fake|cq-echo
//
// echo:  every ModelInfer is parsed and answered with the response Triton gave to the first one;
// proxy: every ModelInfer is passed to Triton as it came, one call per request, and its answer passed back;
// fake:  a worker that costs next to nothing, for measuring the sidecar alone (`bench sidecar --fake-worker`): as
//        echo, but each answer has as many rows as its request (the first answer's rows, each repeated), so the
//        sidecar's batches of any size are answered, and the statistics count rows.
// cq-echo: echo on gRPC's other asynchronous API, a completion queue that one thread of ours drains (the callback
//        API's alternative, measured beside it).
// Metadata, config, statistics, health and repository calls go to Triton, as in the Python floor, and
// ServerMetadata drops the statistics extension so perf_analyzer asks for none. The other modes are on gRPC's callback
// API: no thread per call, the library's own pollers run the handlers, and no handler blocks (the proxy's Triton call
// completes in a callback); cq-echo's one thread waits for each call it passes to Triton (the first ModelInfer and
// perf_analyzer's few others).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "grpc_service.grpc.pb.h"

namespace {

using inference::GRPCInferenceService;

class Floor final : public GRPCInferenceService::CallbackService {
 public:
  Floor(std::shared_ptr<grpc::Channel> triton, bool echo, bool fake)
      : stub_(GRPCInferenceService::NewStub(triton)), echo_(echo || fake), fake_(fake) {}

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx, const inference::ModelInferRequest* req,
                                       inference::ModelInferResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (echo_ && has_canned_.load(std::memory_order_acquire)) {
      if (fake_) Fake(*req, resp);
      else resp->CopyFrom(canned_);
      answered_.fetch_add(fake_ ? Rows(*req) : 1, std::memory_order_relaxed);
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }
    auto* call = new grpc::ClientContext();
    stub_->async()->ModelInfer(call, req, resp, [this, reactor, call, req, resp](grpc::Status status) {
      if (echo_ && status.ok()) {
        std::call_once(canned_once_, [&] {
          canned_.CopyFrom(*resp);
          canned_rows_ = Rows(*req);
          has_canned_.store(true, std::memory_order_release);
        });
        answered_.fetch_add(fake_ ? Rows(*req) : 1, std::memory_order_relaxed);
      }
      delete call;
      reactor->Finish(status);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const inference::ServerMetadataRequest* req,
                                           inference::ServerMetadataResponse* resp) override {
    return Forward(ctx, req, resp, &Stub::ServerMetadata, [](inference::ServerMetadataResponse* r) {
      auto* ext = r->mutable_extensions();
      for (int i = ext->size() - 1; i >= 0; --i)
        if (ext->Get(i) == "statistics") ext->erase(ext->begin() + i);
    });
  }

  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* ctx,
                                            const inference::ModelStatisticsRequest* req,
                                            inference::ModelStatisticsResponse* resp) override {
    // in echo mode Triton served only the first request: the count is the requests this server answered
    return Forward(ctx, req, resp, &Stub::ModelStatistics, [this](inference::ModelStatisticsResponse* r) {
      if (!echo_) return;
      for (auto& model : *r->mutable_model_stats()) model.set_inference_count(answered_.load());
    });
  }

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx, const inference::ServerLiveRequest* req,
                                       inference::ServerLiveResponse* resp) override {
    return Forward(ctx, req, resp, &Stub::ServerLive);
  }
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx, const inference::ServerReadyRequest* req,
                                        inference::ServerReadyResponse* resp) override {
    return Forward(ctx, req, resp, &Stub::ServerReady);
  }
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx, const inference::ModelReadyRequest* req,
                                       inference::ModelReadyResponse* resp) override {
    return Forward(ctx, req, resp, &Stub::ModelReady);
  }
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const inference::ModelMetadataRequest* req,
                                          inference::ModelMetadataResponse* resp) override {
    return Forward(ctx, req, resp, &Stub::ModelMetadata);
  }
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* ctx, const inference::ModelConfigRequest* req,
                                        inference::ModelConfigResponse* resp) override {
    return Forward(ctx, req, resp, &Stub::ModelConfig);
  }

  // what a sidecar asks of its workers besides inference (its fake worker passes them to Triton)
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const inference::RepositoryIndexRequest* req,
                                            inference::RepositoryIndexResponse* resp) override {
    return Forward(ctx, req, resp, &Stub::RepositoryIndex);
  }
  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* ctx,
                                                const inference::RepositoryModelLoadRequest* req,
                                                inference::RepositoryModelLoadResponse* resp) override {
    return Forward(ctx, req, resp, &Stub::RepositoryModelLoad);
  }
  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* ctx,
                                                  const inference::RepositoryModelUnloadRequest* req,
                                                  inference::RepositoryModelUnloadResponse* resp) override {
    return Forward(ctx, req, resp, &Stub::RepositoryModelUnload);
  }

 private:
  using Stub = GRPCInferenceService::Stub::async_interface;

  static int64_t Rows(const inference::ModelInferRequest& req) {
    return req.inputs_size() > 0 && req.inputs(0).shape_size() > 0 ? std::max<int64_t>(req.inputs(0).shape(0), 1) : 1;
  }

  // The canned answer resized to the request's rows: each output's first row repeated.
  void Fake(const inference::ModelInferRequest& req, inference::ModelInferResponse* resp) const {
    int64_t rows = Rows(req);
    resp->set_model_name(canned_.model_name());
    resp->set_model_version(canned_.model_version());
    resp->set_id(req.id());
    for (int i = 0; i < canned_.outputs_size(); ++i) {
      auto* out = resp->add_outputs();
      *out = canned_.outputs(i);
      if (out->shape_size() > 0) out->set_shape(0, rows);
      const std::string& all = canned_.raw_output_contents(i);
      size_t row = all.size() / static_cast<size_t>(canned_rows_);
      std::string* raw = resp->add_raw_output_contents();
      raw->reserve(row * static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) raw->append(all, 0, row);
    }
  }

  // Passes one unary call to Triton and its answer back, after `edit` (if any) has changed it.
  template <typename Req, typename Resp, typename Edit = void (*)(Resp*)>
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* ctx, const Req* req, Resp* resp,
                                    void (Stub::*method)(grpc::ClientContext*, const Req*, Resp*,
                                                         std::function<void(grpc::Status)>),
                                    Edit edit = [](Resp*) {}) {
    auto* reactor = ctx->DefaultReactor();
    auto* call = new grpc::ClientContext();
    (stub_->async()->*method)(call, req, resp, [reactor, call, resp, edit](grpc::Status status) {
      if (status.ok()) edit(resp);
      delete call;
      reactor->Finish(status);
    });
    return reactor;
  }

  std::unique_ptr<GRPCInferenceService::Stub> stub_;
  const bool echo_, fake_;
  std::once_flag canned_once_;
  int64_t canned_rows_ = 1;
  std::atomic<bool> has_canned_{false};
  inference::ModelInferResponse canned_;
  std::atomic<long> answered_{0};
};

int Usage() {
  std::cerr << "usage: accscale-floor --port P --triton HOST:PORT --mode echo|proxy|fake|cq-echo [--host 127.0.0.1]\n";
  return 2;
}

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string out;
  for (const auto& slice : slices) out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return out;
}

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// Echo on a completion queue: every method arrives as bytes (a generic service); ModelInfer is answered with
// Triton's first answer, any other call is passed to Triton and waited for on this thread (only perf_analyzer's
// few set-up and statistics calls), with the same edits as the callback floor's.
int ServeCompletionQueue(const std::string& address, std::shared_ptr<grpc::Channel> triton) {
  grpc::GenericStub stub(triton);
  grpc::AsyncGenericService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterAsyncGenericService(&service);
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::cerr << "accscale-floor: could not listen on " << address << "\n";
    return 1;
  }
  std::cout << "listening on " << address << std::endl;
  struct Call {
    grpc::GenericServerContext context;
    grpc::GenericServerAsyncReaderWriter stream{&context};
    grpc::ByteBuffer request;
    enum { kAccepted, kRead, kAnswered } state = kAccepted;
  };
  // Triton's answer to one call, or its error; a Triton that does not answer fails the call in 10 s
  auto forward = [&stub](const std::string& method, const grpc::ByteBuffer& in, std::string* answer) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::ByteBuffer out;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &in, &out,
                   [&done](grpc::Status status) { done.set_value(std::move(status)); });
    grpc::Status status = done.get_future().get();
    if (status.ok()) *answer = Bytes(out);
    return status;
  };
  auto accept = [&] {
    auto* call = new Call;
    service.RequestCall(&call->context, &call->stream, cq.get(), cq.get(), call);
  };
  accept();
  std::string canned;
  long answered = 0;
  void* tag;
  bool ok;
  while (cq->Next(&tag, &ok)) {
    auto* call = static_cast<Call*>(tag);
    if (!ok || call->state == Call::kAnswered) {
      delete call;
      continue;
    }
    if (call->state == Call::kAccepted) {
      accept();
      call->state = Call::kRead;
      call->stream.Read(&call->request, call);
      continue;
    }
    const std::string& method = call->context.method();
    std::string out;
    grpc::Status status;
    if (method == "/inference.GRPCInferenceService/ModelInfer") {
      if (canned.empty()) status = forward(method, call->request, &canned);  // kept only if Triton answered
      out = canned;
      if (status.ok()) ++answered;
    } else if (method == "/inference.GRPCInferenceService/ModelStatistics") {
      inference::ModelStatisticsResponse r;
      if ((status = forward(method, call->request, &out)).ok() && r.ParseFromString(out)) {
        for (auto& model : *r.mutable_model_stats()) model.set_inference_count(answered);
        out = r.SerializeAsString();
      }
    } else if (method == "/inference.GRPCInferenceService/ServerMetadata") {
      inference::ServerMetadataResponse r;
      if ((status = forward(method, call->request, &out)).ok() && r.ParseFromString(out)) {
        auto* ext = r.mutable_extensions();
        for (int i = ext->size() - 1; i >= 0; --i)
          if (ext->Get(i) == "statistics") ext->erase(ext->begin() + i);
        out = r.SerializeAsString();
      }
    } else {
      status = forward(method, call->request, &out);
    }
    call->state = Call::kAnswered;
    if (status.ok()) call->stream.WriteAndFinish(Buffer(out), grpc::WriteOptions(), grpc::Status::OK, call);
    else call->stream.Finish(status, call);  // Triton's error, as the callback floors pass it on
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1", port, triton, mode;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i], value = argv[i + 1];
    if (key == "--port") port = value;
    else if (key == "--triton") triton = value;
    else if (key == "--mode") mode = value;
    else if (key == "--host") host = value;
    else return Usage();
  }
  if (port.empty() || triton.empty() || (mode != "echo" && mode != "proxy" && mode != "fake" && mode != "cq-echo"))
    return Usage();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  if (mode == "cq-echo")
    return ServeCompletionQueue(host + ":" + port,
                                grpc::CreateCustomChannel(triton, grpc::InsecureChannelCredentials(), args));
  Floor service(grpc::CreateCustomChannel(triton, grpc::InsecureChannelCredentials(), args), mode == "echo",
                mode == "fake");
  grpc::ServerBuilder builder;
  builder.AddListeningPort(host + ":" + port, grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::cerr << "accscale-floor: could not listen on " << host << ":" << port << "\n";
    return 1;
  }
  std::cout << "listening on " << host << ":" << port << std::endl;
  server->Wait();
  return 0;
}
