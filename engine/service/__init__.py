"""The gRPC service: servicer, server (grpcio and the native C++ front end), auth, metrics, CPU affinity."""
