"""The hashq coordinator: elects a leader through ZooKeeper and assigns buckets to workers."""
