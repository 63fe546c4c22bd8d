"""What runs inside the traced ranks: the patches (shim), c10d's hooks on torch >= 2.14, the
recorder that writes each rank's ring, and the few things a rank starts or answers (the node
watchdog's launcher, the job identity, Flight Recorder requests). Imported only when tracing is on."""
