// The least a native gRPC front end costs per request: the C++ counterpart of grpc_floor.py, for
// `accscale bench sidecar --floor`, so the edge's technology is chosen by measurement (issue 45).
//
//   accscale-floor --port P --triton HOST:PORT --mode echo|proxy [--threads N]
//
// echo:  every ModelInfer is parsed and answered with the response Triton gave to the first one;
// proxy: every ModelInfer is passed to Triton as it came, one call per request, and its answer passed back.
// Metadata, config, statistics and health calls go to Triton, as in the Python floor, and ServerMetadata drops the
// statistics extension so perf_analyzer asks for none. gRPC's callback API: no thread per call, the library's own
// pollers run the handlers, and no handler blocks (the proxy's Triton call completes in a callback).

#include <atomic>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>

#include "grpc_service.grpc.pb.h"

namespace {

using inference::GRPCInferenceService;

class Floor final : public GRPCInferenceService::CallbackService {
 public:
  Floor(std::shared_ptr<grpc::Channel> triton, bool echo)
      : stub_(GRPCInferenceService::NewStub(triton)), echo_(echo) {}

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx, const inference::ModelInferRequest* req,
                                       inference::ModelInferResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (echo_ && has_canned_.load(std::memory_order_acquire)) {
      resp->CopyFrom(canned_);
      answered_.fetch_add(1, std::memory_order_relaxed);
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }
    auto* call = new grpc::ClientContext();
    stub_->async()->ModelInfer(call, req, resp, [this, reactor, call, resp](grpc::Status status) {
      if (echo_ && status.ok()) {
        std::call_once(canned_once_, [&] {
          canned_.CopyFrom(*resp);
          has_canned_.store(true, std::memory_order_release);
        });
        answered_.fetch_add(1, std::memory_order_relaxed);
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

 private:
  using Stub = GRPCInferenceService::Stub::async_interface;

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
  const bool echo_;
  std::once_flag canned_once_;
  std::atomic<bool> has_canned_{false};
  inference::ModelInferResponse canned_;
  std::atomic<long> answered_{0};
};

int Usage() {
  std::cerr << "usage: accscale-floor --port P --triton HOST:PORT --mode echo|proxy [--host 127.0.0.1]\n";
  return 2;
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
  if (port.empty() || triton.empty() || (mode != "echo" && mode != "proxy")) return Usage();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  Floor service(grpc::CreateCustomChannel(triton, grpc::InsecureChannelCredentials(), args), mode == "echo");
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
