"""The wire format shared by service and client: proto conversion and the gRPC error mapping."""
