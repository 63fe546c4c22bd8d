"""One process per host beside the ranks: the watchdog loop, what it sees of the local ranks
(liveness, live stacks), and the meeting point through the job's c10d store where hosts'
watchdogs share what they see. Never inside a traced rank."""
