"""The replica server: hosts partition replicas, leads some and follows others."""
