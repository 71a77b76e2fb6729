"""Sources: where a pipeline's input comes from, with offsets that commit with each batch
(a folder of CSV or JSON-lines files on a filesystem or S3)."""
