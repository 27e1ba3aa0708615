// A gRPC ByteBuffer as Python bytes: shared by the server front end and the client channel.
#ifndef POLYINDEX_NATIVE_BYTE_BUFFER_H_
#define POLYINDEX_NATIVE_BYTE_BUFFER_H_

#include <Python.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstring>
#include <vector>

namespace polyindex {

// New reference, or nullptr with a Python error set. The GIL must be held.
inline PyObject* ToBytes(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> slices;
  if (!bb.Dump(&slices).ok()) return PyBytes_FromStringAndSize(nullptr, 0);
  if (slices.size() == 1)  // the common case: no second copy
    return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(slices[0].begin()),
                                     static_cast<Py_ssize_t>(slices[0].size()));
  size_t n = 0;
  for (auto& s : slices) n += s.size();
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
  if (out == nullptr) return nullptr;
  char* p = PyBytes_AS_STRING(out);
  for (auto& s : slices) {
    std::memcpy(p, s.begin(), s.size());
    p += s.size();
  }
  return out;
}

}  // namespace polyindex

#endif  // POLYINDEX_NATIVE_BYTE_BUFFER_H_
