"""The content-addressed artifact store: its interface, the local folder and the S3-compatible bucket."""
