# The prescaler operator image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY forecasting ./forecasting
RUN pip install --no-cache-dir . && useradd --uid 10001 --no-create-home prescaler
USER 10001
ENTRYPOINT ["prescaler"]
CMD ["run"]
