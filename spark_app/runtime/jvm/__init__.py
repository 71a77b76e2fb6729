"""The JVM a driver runs: its SparkSession (jars, state store, S3), the class archive that
makes it start sooner, and the Python that Spark's workers run."""
