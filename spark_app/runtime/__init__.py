"""The Spark side of spark_app: session, sources, outputs, plan analysis, the driver."""
