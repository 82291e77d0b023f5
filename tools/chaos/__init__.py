"""The chaos harness: hashq under churn, checked by an independent checker (`make chaos`)."""
