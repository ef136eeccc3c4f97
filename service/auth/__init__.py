"""Who is asking: API keys and tenants (``keys``), and the dashboard's login cookies (``sessions``)."""
