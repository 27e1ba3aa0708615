// polyindex.client._grpc_channel: blocking unary calls over a gRPC C++ channel, for the client SDK.
//
// Why: grpcio's Python client completes a call on its own event-engine thread and then wakes
// the caller; gRPC C++ lets the calling thread poll the socket itself. On the 2-vCPU VM that
// is about 0.25 ms less per call (interleaved, same server). The SDK parses and builds the
// protobuf messages in Python; this module only moves bytes, metadata and a status.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>

#include "byte_buffer.h"  // engine/wire/native

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace {

struct ChannelObject {
  PyObject_HEAD
  std::shared_ptr<grpc::Channel>* channel;  // null once closed
};

void Channel_dealloc(ChannelObject* self) {
  delete self->channel;
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

// Channel(target, secure, root_certs, max_message_bytes): secure with root_certs None uses
// the system's roots.
int Channel_init(ChannelObject* self, PyObject* args, PyObject*) {
  const char* target;
  int secure, max_message;
  PyObject* roots;
  if (!PyArg_ParseTuple(args, "spOi", &target, &secure, &roots, &max_message)) return -1;
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (secure) {
    grpc::SslCredentialsOptions opts;
    if (roots != Py_None) {
      char* pem;
      Py_ssize_t len;
      if (PyBytes_AsStringAndSize(roots, &pem, &len) < 0) return -1;
      opts.pem_root_certs.assign(pem, static_cast<size_t>(len));
    }
    creds = grpc::SslCredentials(opts);
  }
  grpc::ChannelArguments chargs;
  chargs.SetMaxReceiveMessageSize(max_message);
  chargs.SetMaxSendMessageSize(max_message);
  delete self->channel;
  self->channel = new std::shared_ptr<grpc::Channel>(grpc::CreateCustomChannel(target, creds, chargs));
  return 0;
}

PyObject* Str(grpc::string_ref s) { return PyUnicode_DecodeUTF8(s.data(), s.size(), "replace"); }

// unary(path, request, timeout | None, metadata) -> (code, details, response | None, trailers)
PyObject* Channel_unary(ChannelObject* self, PyObject* args) {
  const char* path;
  const char* data;
  Py_ssize_t len;
  PyObject *timeout, *metadata;
  if (!PyArg_ParseTuple(args, "sy#OO", &path, &data, &len, &timeout, &metadata)) return nullptr;
  if (self->channel == nullptr) {
    PyErr_SetString(PyExc_ValueError, "the channel is closed");
    return nullptr;
  }
  grpc::ClientContext ctx;
  if (timeout != Py_None) {
    double seconds = PyFloat_AsDouble(timeout);
    if (seconds == -1.0 && PyErr_Occurred()) return nullptr;
    if (seconds < 1e9)  // beyond ~30 years (or inf): no deadline; also keeps the cast defined
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
  }
  PyObject* seq = PySequence_Fast(metadata, "metadata must be a sequence of (key, value)");
  if (seq == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const char *k, *v;
    Py_ssize_t kn, vn;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "s#s#", &k, &kn, &v, &vn)) {
      Py_DECREF(seq);
      return nullptr;
    }
    ctx.AddMetadata(std::string(k, kn), std::string(v, vn));
  }
  Py_DECREF(seq);
  grpc::Slice slice(data, static_cast<size_t>(len));  // copies: the GIL is released below
  grpc::ByteBuffer request(&slice, 1), response;
  std::shared_ptr<grpc::Channel> channel = *self->channel;  // close() may run meanwhile
  grpc::internal::RpcMethod method(path, grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Status status;
  Py_BEGIN_ALLOW_THREADS
  status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), method, &ctx, request, &response);
  Py_END_ALLOW_THREADS
  PyObject* body;
  if (status.ok()) {
    body = polyindex::ToBytes(response);
    if (body == nullptr) return nullptr;
  } else {
    Py_INCREF(Py_None);
    body = Py_None;
  }
  const auto& md = ctx.GetServerTrailingMetadata();
  PyObject* trailers = PyTuple_New(static_cast<Py_ssize_t>(md.size()));
  if (trailers == nullptr) {
    Py_DECREF(body);
    return nullptr;
  }
  Py_ssize_t i = 0;
  for (const auto& kv : md) {
    PyObject* pair = Py_BuildValue("(NN)", Str(kv.first), Str(kv.second));
    if (pair == nullptr) {
      Py_DECREF(body);
      Py_DECREF(trailers);
      return nullptr;
    }
    PyTuple_SET_ITEM(trailers, i++, pair);
  }
  const std::string& msg = status.error_message();
  return Py_BuildValue("(is#NN)", static_cast<int>(status.error_code()), msg.data(),
                       static_cast<Py_ssize_t>(msg.size()), body, trailers);
}

PyObject* Channel_close(ChannelObject* self, PyObject*) {
  delete self->channel;  // calls in flight hold their own reference
  self->channel = nullptr;
  Py_RETURN_NONE;
}

PyMethodDef kChannelMethods[] = {
    {"unary", (PyCFunction)Channel_unary, METH_VARARGS,
     "unary(path, request, timeout, metadata) -> (code, details, response | None, trailers)"},
    {"close", (PyCFunction)Channel_close, METH_NOARGS, "Close the channel."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject ChannelType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_grpc_channel",
                       "Blocking unary calls over a gRPC C++ channel.", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__grpc_channel(void) {
  ChannelType.tp_name = "polyindex.client._grpc_channel.Channel";
  ChannelType.tp_basicsize = sizeof(ChannelObject);
  ChannelType.tp_flags = Py_TPFLAGS_DEFAULT;
  ChannelType.tp_methods = kChannelMethods;
  ChannelType.tp_new = PyType_GenericNew;
  ChannelType.tp_init = (initproc)Channel_init;
  ChannelType.tp_dealloc = (destructor)Channel_dealloc;
  if (PyType_Ready(&ChannelType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  Py_INCREF(&ChannelType);
  if (PyModule_AddObject(m, "Channel", reinterpret_cast<PyObject*>(&ChannelType)) < 0) {
    Py_DECREF(&ChannelType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
