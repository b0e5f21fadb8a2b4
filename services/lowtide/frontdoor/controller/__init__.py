"""The controller role: who leads each partition and where its replicas live. It owns every
write of a partition's leader, ISR and replica set that is not a leader's own ISR change: the
controller loop of the one front door holding the controller lease (elections when a leader
dies, leader balance, finishing reassignments: ``controller.py``), and the Admin requests that
start the same compare-and-set steps on demand (ElectLeaders: ``elections.py``;
Alter/ListPartitionReassignments: ``reassignments.py``). It imports no other role."""
