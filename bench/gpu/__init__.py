"""GPU checks and GPU benches (exactness, throughput, prefill, the train step, the cluster rehearsal),
run on a lent GPU machine."""
