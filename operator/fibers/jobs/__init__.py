"""Code that runs inside Spark drivers and consumer pods, not in the operator."""
