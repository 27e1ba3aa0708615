// polyindex.service._grpc_front: a gRPC C++ server that hands each call to a Python dispatcher.
//
// Why: with grpcio's Python server, a 1-client call pays about 0.25 ms more transport than
// with a C++ server (thread hand-offs and Python-level polling per call). Here the transport,
// HTTP/2, TLS, message-size limits, deadlines and the health service are gRPC C++; every
// other method is registered as raw bytes and run by `dispatch(index, payload, call)` in
// Python under the GIL, so request parsing, auth, errors and metrics stay in one place
// (polyindex/native_server.py). The sync server runs a handler on the thread that polled
// its request: no hand-off between threads on the way in.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/method_handler.h>

#include "byte_buffer.h"  // engine/wire/native

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

using grpc::ByteBuffer;
using grpc::ServerContext;
using polyindex::ToBytes;
using Reader = grpc::ServerReader<ByteBuffer>;
using Stream = grpc::ServerReaderWriter<ByteBuffer, ByteBuffer>;

enum Kind { kUnary = 0, kClientStream = 1, kBidi = 2 };

// Counting semaphore: at most `workers` calls run Python at once (the --workers setting).
class Gate {
 public:
  explicit Gate(int n) : free_(n) {}
  void Enter() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return free_ > 0; });
    --free_;
  }
  void Leave() {
    { std::lock_guard<std::mutex> lock(mu_); ++free_; }
    cv_.notify_one();
  }
 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int free_;
};

// A Python thread state per gRPC thread, made at the thread's first call and kept until it
// exits: PyGILState_Ensure/Release on a thread that holds none make and free one on every
// call (issue 38). Threads exit while the server shuts down (with the GIL released by
// Server_shutdown, before the interpreter finalizes: NativeFront stops at exit); one that
// exits after finalization began leaves its state (freeing it then would need the GIL).
#if PY_VERSION_HEX >= 0x030D0000
#define POLYINDEX_FINALIZING() Py_IsFinalizing()
#else
#define POLYINDEX_FINALIZING() _Py_IsFinalizing()
#endif

class PyThread {
 public:
  void Enter() {
    if (saved_ == nullptr) {
      held_ = PyGILState_Ensure();  // the GIL is held from here
      return;
    }
    PyEval_RestoreThread(saved_);
    saved_ = nullptr;
  }
  void Leave() { saved_ = PyEval_SaveThread(); }
  ~PyThread() {
    if (saved_ == nullptr || !Py_IsInitialized() || POLYINDEX_FINALIZING()) return;
    PyEval_RestoreThread(saved_);
    PyGILState_Release(held_);
  }

 private:
  PyThreadState* saved_ = nullptr;  // between calls: this thread's state, GIL released
  PyGILState_STATE held_ = PyGILState_UNLOCKED;
};
thread_local PyThread py_thread;

// ---------------------------------------------------------------- the call, as Python sees it
// Valid only while its handler runs; afterwards every method answers as for a finished call.
struct CallObject {
  PyObject_HEAD
  ServerContext* ctx;
  Reader* reader;
  Stream* stream;
  bool live;
};

PyObject* Call_read(CallObject* self, PyObject*) {
  if (!self->live || (self->reader == nullptr && self->stream == nullptr)) Py_RETURN_NONE;
  ByteBuffer bb;
  bool ok;
  Py_BEGIN_ALLOW_THREADS
  ok = self->reader != nullptr ? self->reader->Read(&bb) : self->stream->Read(&bb);
  Py_END_ALLOW_THREADS
  if (!ok) Py_RETURN_NONE;  // end of the stream, or the client went away (see is_active)
  return ToBytes(bb);
}

PyObject* Call_write(CallObject* self, PyObject* arg) {
  char* data;
  Py_ssize_t len;
  if (PyBytes_AsStringAndSize(arg, &data, &len) < 0) return nullptr;
  if (!self->live || self->stream == nullptr) Py_RETURN_FALSE;
  grpc::Slice slice(data, static_cast<size_t>(len));  // copies
  ByteBuffer bb(&slice, 1);
  bool ok;
  Py_BEGIN_ALLOW_THREADS
  ok = self->stream->Write(bb);
  Py_END_ALLOW_THREADS
  return PyBool_FromLong(ok);
}

PyObject* Call_is_active(CallObject* self, PyObject*) {
  return PyBool_FromLong(self->live && !self->ctx->IsCancelled());
}

PyObject* Call_time_remaining(CallObject* self, PyObject*) {
  if (!self->live) return PyFloat_FromDouble(0.0);
  auto deadline = self->ctx->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) Py_RETURN_NONE;
  std::chrono::duration<double> left = deadline - std::chrono::system_clock::now();
  return PyFloat_FromDouble(left.count() > 0 ? left.count() : 0.0);
}

// ((key, value), ...): str values, bytes for binary ("-bin") keys, as grpcio gives them.
PyObject* Call_metadata(CallObject* self, PyObject*) {
  if (!self->live) return PyTuple_New(0);
  const auto& md = self->ctx->client_metadata();
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(md.size()));
  if (out == nullptr) return nullptr;
  Py_ssize_t i = 0;
  for (const auto& kv : md) {
    std::string key(kv.first.data(), kv.first.size());
    bool binary = key.size() > 4 && key.compare(key.size() - 4, 4, "-bin") == 0;
    PyObject* value = binary
        ? PyBytes_FromStringAndSize(kv.second.data(), kv.second.size())
        : PyUnicode_DecodeUTF8(kv.second.data(), kv.second.size(), "replace");
    PyObject* k = PyUnicode_DecodeUTF8(key.data(), key.size(), "replace");
    if (value == nullptr || k == nullptr) {
      Py_XDECREF(value);
      Py_XDECREF(k);
      Py_DECREF(out);
      return nullptr;
    }
    PyObject* pair = PyTuple_Pack(2, k, value);
    Py_DECREF(k);
    Py_DECREF(value);
    if (pair == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, i++, pair);
  }
  return out;
}

PyObject* Call_peer(CallObject* self, PyObject*) {
  if (!self->live) return PyUnicode_FromString("");
  std::string peer = self->ctx->peer();
  return PyUnicode_DecodeUTF8(peer.data(), peer.size(), "replace");
}

PyMethodDef kCallMethods[] = {
    {"read", (PyCFunction)Call_read, METH_NOARGS, "The next request message (bytes), or None at the end."},
    {"write", (PyCFunction)Call_write, METH_O, "Send one response message (bidi calls); False if the call is gone."},
    {"is_active", (PyCFunction)Call_is_active, METH_NOARGS, "False once the client cancelled or the call ended."},
    {"time_remaining", (PyCFunction)Call_time_remaining, METH_NOARGS, "Seconds to the deadline, None without one."},
    {"metadata", (PyCFunction)Call_metadata, METH_NOARGS, "The client's metadata as (key, value) pairs."},
    {"peer", (PyCFunction)Call_peer, METH_NOARGS, "The client's address."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject CallType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---------------------------------------------------------------- the service
class Front;

class RawService : public grpc::Service {
 public:
  explicit RawService(Front* front) : front_(front) {}
  void Add(const char* path, int kind, int index);  // `path` must outlive the service
 private:
  Front* front_;
};

class Front {
 public:
  Front(PyObject* dispatch, int workers) : dispatch_(dispatch), gate_(workers) {
    Py_INCREF(dispatch_);
  }
  ~Front() {
    PyGILState_STATE st = PyGILState_Ensure();
    Py_DECREF(dispatch_);
    PyGILState_Release(st);
  }

  grpc::Status Handle(int index, ServerContext* ctx, const ByteBuffer* request,
                      ByteBuffer* response, Reader* reader, Stream* stream) {
    gate_.Enter();
    py_thread.Enter();
    grpc::Status status = CallPython(index, ctx, request, response, reader, stream);
    py_thread.Leave();
    gate_.Leave();
    return status;
  }

  std::vector<std::string> paths;  // method names, kept alive for grpc::RpcServiceMethod
  std::vector<std::unique_ptr<RawService>> services;
  std::unique_ptr<grpc::Server> server;
  int port = 0;

 private:
  // dispatch(index, payload | None, call) -> (code, details, body | None, trailers)
  grpc::Status CallPython(int index, ServerContext* ctx, const ByteBuffer* request,
                          ByteBuffer* response, Reader* reader, Stream* stream) {
    PyObject* payload = request != nullptr ? ToBytes(*request) : (Py_INCREF(Py_None), Py_None);
    CallObject* call = PyObject_New(CallObject, &CallType);
    if (payload == nullptr || call == nullptr) {
      Py_XDECREF(payload);
      Py_XDECREF(reinterpret_cast<PyObject*>(call));
      PyErr_Clear();
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "out of memory reading the request");
    }
    call->ctx = ctx;
    call->reader = reader;
    call->stream = stream;
    call->live = true;
    PyObject* result = PyObject_CallFunction(dispatch_, "iOO", index, payload,
                                             reinterpret_cast<PyObject*>(call));
    call->live = false;  // Python may keep a reference; the C++ call is over
    Py_DECREF(reinterpret_cast<PyObject*>(call));
    Py_DECREF(payload);
    grpc::Status status = Unpack(result, ctx, response);
    Py_XDECREF(result);
    return status;
  }

  grpc::Status Unpack(PyObject* result, ServerContext* ctx, ByteBuffer* response) {
    int code;
    const char* details;
    Py_ssize_t details_len;
    PyObject *body, *trailers;
    if (result == nullptr ||
        !PyArg_ParseTuple(result, "is#OO", &code, &details, &details_len, &body, &trailers)) {
      PyErr_WriteUnraisable(dispatch_);  // a bug in the dispatcher: log it, answer INTERNAL
      return grpc::Status(grpc::StatusCode::INTERNAL, "internal error in the gRPC front end");
    }
    PyObject* seq = PySequence_Fast(trailers, "trailers must be a sequence");
    if (seq != nullptr) {
      for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
        const char *k, *v;
        Py_ssize_t kn, vn;
        if (PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "s#s#", &k, &kn, &v, &vn))
          ctx->AddTrailingMetadata(std::string(k, kn), std::string(v, vn));
        else
          PyErr_WriteUnraisable(dispatch_);
      }
      Py_DECREF(seq);
    } else {
      PyErr_WriteUnraisable(dispatch_);
    }
    if (code == 0 && response != nullptr && PyBytes_Check(body)) {
      grpc::Slice slice(PyBytes_AS_STRING(body), static_cast<size_t>(PyBytes_GET_SIZE(body)));
      *response = ByteBuffer(&slice, 1);
    }
    return grpc::Status(static_cast<grpc::StatusCode>(code), std::string(details, details_len));
  }

  PyObject* dispatch_;
  Gate gate_;
};

void RawService::Add(const char* path, int kind, int index) {
  Front* front = front_;
  grpc::internal::MethodHandler* handler;
  grpc::internal::RpcMethod::RpcType type;
  if (kind == kUnary) {
    type = grpc::internal::RpcMethod::NORMAL_RPC;
    handler = new grpc::internal::RpcMethodHandler<RawService, ByteBuffer, ByteBuffer>(
        [front, index](RawService*, ServerContext* ctx, const ByteBuffer* req, ByteBuffer* resp) {
          return front->Handle(index, ctx, req, resp, nullptr, nullptr);
        }, this);
  } else if (kind == kClientStream) {
    type = grpc::internal::RpcMethod::CLIENT_STREAMING;
    handler = new grpc::internal::ClientStreamingHandler<RawService, ByteBuffer, ByteBuffer>(
        [front, index](RawService*, ServerContext* ctx, Reader* reader, ByteBuffer* resp) {
          return front->Handle(index, ctx, nullptr, resp, reader, nullptr);
        }, this);
  } else {
    type = grpc::internal::RpcMethod::BIDI_STREAMING;
    handler = new grpc::internal::BidiStreamingHandler<RawService, ByteBuffer, ByteBuffer>(
        [front, index](RawService*, ServerContext* ctx, Stream* stream) {
          return front->Handle(index, ctx, nullptr, nullptr, nullptr, stream);
        }, this);
  }
  AddMethod(new grpc::internal::RpcServiceMethod(path, type, handler));
}

// ---------------------------------------------------------------- the server, as Python sees it
struct ServerObject {
  PyObject_HEAD
  Front* front;
};

void Server_dealloc(ServerObject* self) {
  if (self->front != nullptr) {
    if (self->front->server) {
      Py_BEGIN_ALLOW_THREADS
      self->front->server->Shutdown(std::chrono::system_clock::now());
      self->front->server->Wait();
      Py_END_ALLOW_THREADS
    }
    delete self->front;
  }
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyObject* Server_port(ServerObject* self, PyObject*) { return PyLong_FromLong(self->front->port); }

// Health probes see NOT_SERVING from now on (while in-flight calls drain).
PyObject* Server_not_serving(ServerObject* self, PyObject*) {
  if (self->front->server && self->front->server->GetHealthCheckService() != nullptr)
    self->front->server->GetHealthCheckService()->Shutdown();
  Py_RETURN_NONE;
}

// Health answers SERVING or NOT_SERVING for every service (the models loading at start);
// after not_serving() it stays NOT_SERVING (gRPC ignores it after the service's Shutdown).
PyObject* Server_set_serving(ServerObject* self, PyObject* arg) {
  int serving = PyObject_IsTrue(arg);
  if (serving < 0) return nullptr;
  if (self->front->server && self->front->server->GetHealthCheckService() != nullptr)
    self->front->server->GetHealthCheckService()->SetServingStatus(serving != 0);
  Py_RETURN_NONE;
}

// Stop taking calls, let in-flight ones finish for up to `grace` seconds, then cancel them.
PyObject* Server_shutdown(ServerObject* self, PyObject* arg) {
  double grace = PyFloat_AsDouble(arg);
  if (grace == -1.0 && PyErr_Occurred()) return nullptr;
  if (self->front->server) {
    auto deadline = std::chrono::system_clock::now() +
                    std::chrono::microseconds(static_cast<int64_t>(grace * 1e6));
    Py_BEGIN_ALLOW_THREADS
    self->front->server->Shutdown(deadline);
    self->front->server->Wait();
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

PyMethodDef kServerMethods[] = {
    {"port", (PyCFunction)Server_port, METH_NOARGS, "The bound port."},
    {"not_serving", (PyCFunction)Server_not_serving, METH_NOARGS, "Health answers NOT_SERVING from now on."},
    {"set_serving", (PyCFunction)Server_set_serving, METH_O, "Health answers SERVING (True) or NOT_SERVING."},
    {"shutdown", (PyCFunction)Server_shutdown, METH_O, "Drain for up to `grace` seconds, then stop; blocks."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject ServerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// start(dispatch, methods, address, max_message_bytes, workers, tls, health_names,
//       reuseport, private_address) -> Server
// methods: [(path, kind)], the index into it is what dispatch receives; tls: None or
// (key_pem, cert_pem); health_names: services reported SERVING besides ""; reuseport: share
// `address` with the other processes of `polyindex serve --processes N` (SO_REUSEPORT);
// private_address: "" or a second, plaintext listener (a unix socket of the process group).
PyObject* Start(PyObject*, PyObject* args) {
  PyObject *dispatch, *methods, *tls, *health_names;
  const char *address, *private_address = "";
  int max_message, workers, reuseport = 0;
  if (!PyArg_ParseTuple(args, "OOsiiOO|is", &dispatch, &methods, &address, &max_message,
                        &workers, &tls, &health_names, &reuseport, &private_address))
    return nullptr;
  if (!PyCallable_Check(dispatch)) {
    PyErr_SetString(PyExc_TypeError, "dispatch must be callable");
    return nullptr;
  }
  if (workers < 1) {
    PyErr_SetString(PyExc_ValueError, "workers must be >= 1");
    return nullptr;
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (tls != Py_None) {
    const char *key, *cert;
    if (!PyArg_ParseTuple(tls, "yy", &key, &cert)) return nullptr;
    grpc::SslServerCredentialsOptions opts;
    opts.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(opts);
  }
  std::unique_ptr<Front> front(new Front(dispatch, workers));
  PyObject* seq = PySequence_Fast(methods, "methods must be a sequence");
  if (seq == nullptr) return nullptr;
  std::vector<std::pair<std::string, int>> specs;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const char* path;
    int kind;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "si", &path, &kind)) {
      Py_DECREF(seq);
      return nullptr;
    }
    specs.emplace_back(path, kind);
  }
  Py_DECREF(seq);
  front->paths.reserve(specs.size());  // no reallocation: services keep c_str() pointers
  std::vector<std::string> service_names;
  for (size_t i = 0; i < specs.size(); ++i) {
    front->paths.push_back(specs[i].first);
    const std::string& path = front->paths.back();
    std::string service = path.substr(1, path.rfind('/') - 1);  // "/pkg.Svc/Method"
    size_t s = 0;
    while (s < service_names.size() && service_names[s] != service) ++s;
    if (s == service_names.size()) {  // gRPC routes by full path; one Service per name
      service_names.push_back(service);
      front->services.emplace_back(new RawService(front.get()));
    }
    front->services[s]->Add(path.c_str(), specs[i].second, static_cast<int>(i));
  }
  std::vector<std::string> healthy;
  seq = PySequence_Fast(health_names, "health_names must be a sequence");
  if (seq == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const char* name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
    if (name == nullptr) {
      Py_DECREF(seq);
      return nullptr;
    }
    healthy.emplace_back(name);
  }
  Py_DECREF(seq);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  // A busy port must fail, not be shared silently; several processes of one server share
  // theirs on purpose (the parent checked that no other program holds it).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuseport ? 1 : 0);
  // The sync server ends a thread after its call when it has MAX_POLLERS (default 2) idle
  // ones, and starts another for the next call: under 16 clients that was a thread (and a
  // Python thread state) per few calls. Threads that finished a call stay for the next one.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              std::max(2 * workers, 32));
  builder.AddListeningPort(address, creds, &front->port);
  int private_port = 0;
  if (private_address[0] != '\0')
    builder.AddListeningPort(private_address, grpc::InsecureServerCredentials(), &private_port);
  for (auto& svc : front->services) builder.RegisterService(svc.get());
  Py_BEGIN_ALLOW_THREADS
  front->server = builder.BuildAndStart();
  Py_END_ALLOW_THREADS
  if (!front->server || front->port == 0) {
    if (front->server) front->server->Shutdown();
    PyErr_Format(PyExc_OSError, "cannot listen on %s", address);
    return nullptr;
  }
  if (private_address[0] != '\0' && private_port == 0) {
    front->server->Shutdown();
    PyErr_Format(PyExc_OSError, "cannot listen on %s", private_address);
    return nullptr;
  }
  auto* health = front->server->GetHealthCheckService();
  if (health != nullptr)
    for (auto& name : healthy) health->SetServingStatus(name, true);
  ServerObject* obj = PyObject_New(ServerObject, &ServerType);
  if (obj == nullptr) return nullptr;
  obj->front = front.release();
  return reinterpret_cast<PyObject*>(obj);
}

PyMethodDef kModuleMethods[] = {
    {"start", Start, METH_VARARGS, "Start a gRPC C++ server dispatching to Python; see grpc_front.cc."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_grpc_front",
                       "gRPC C++ front end handing calls to a Python dispatcher.", -1,
                       kModuleMethods};

}  // namespace

PyMODINIT_FUNC PyInit__grpc_front(void) {
  CallType.tp_name = "polyindex.service._grpc_front.Call";
  CallType.tp_basicsize = sizeof(CallObject);
  CallType.tp_flags = Py_TPFLAGS_DEFAULT;
  CallType.tp_methods = kCallMethods;
  CallType.tp_new = nullptr;  // made by the server only
  ServerType.tp_name = "polyindex.service._grpc_front.Server";
  ServerType.tp_basicsize = sizeof(ServerObject);
  ServerType.tp_flags = Py_TPFLAGS_DEFAULT;
  ServerType.tp_methods = kServerMethods;
  ServerType.tp_dealloc = (destructor)Server_dealloc;
  if (PyType_Ready(&CallType) < 0 || PyType_Ready(&ServerType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  PyModule_AddIntConstant(m, "UNARY", kUnary);
  PyModule_AddIntConstant(m, "CLIENT_STREAM", kClientStream);
  PyModule_AddIntConstant(m, "BIDI", kBidi);
  PyModule_AddStringConstant(m, "GRPC_VERSION", grpc::Version().c_str());
  return m;
}
