package idemrpc
