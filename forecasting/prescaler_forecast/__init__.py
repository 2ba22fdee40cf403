"""prescaler_forecast: demand forecasting for prescaler (pure: no Kubernetes or Prometheus)."""
