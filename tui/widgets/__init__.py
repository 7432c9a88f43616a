"""One dashboard panel per module; every panel draws from a DashboardFrame."""
