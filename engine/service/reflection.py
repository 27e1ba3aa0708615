"""Server reflection under both of its names: ``grpc.reflection.v1`` and ``v1alpha``.

grpcio-reflection serves only v1alpha, while grpcurl and newer tools ask for v1 first. The two
protos are the same messages with the same field numbers under another package, so one
servicer answers both (the bytes are identical); the v1 file descriptor, made from the
v1alpha one, is added to the default pool so that reflection can describe v1 itself.
"""
from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA = reflection.SERVICE_NAME  # "grpc.reflection.v1alpha.ServerReflection"
V1 = "grpc.reflection.v1.ServerReflection"
NAMES = (V1, V1ALPHA)
METHOD = "ServerReflectionInfo"
Request, Response = reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse


def _register_v1() -> None:
    pool = descriptor_pool.Default()
    try:
        pool.FindServiceByName(V1)
        return
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    old, new = fdp.package, "grpc.reflection.v1"
    fdp.name, fdp.package = "grpc/reflection/v1/reflection.proto", new
    fdp.ClearField("options")  # v1alpha's java/go package options
    for msg in fdp.message_type:
        for field in msg.field:
            if field.HasField("type_name"):  # message fields only; assigning "" would set it
                field.type_name = field.type_name.replace(f".{old}.", f".{new}.")
    for method in fdp.service[0].method:
        method.input_type = method.input_type.replace(f".{old}.", f".{new}.")
        method.output_type = method.output_type.replace(f".{old}.", f".{new}.")
    pool.AddSerializedFile(fdp.SerializeToString())


def servicer(service_names) -> reflection.ReflectionServicer:
    """One reflection servicer for both names; ``service_names`` are the other services."""
    _register_v1()
    return reflection.ReflectionServicer((*service_names, *NAMES))


def paths() -> list[str]:
    """The method path of each name, v1 first."""
    return [f"/{name}/{METHOD}" for name in NAMES]
