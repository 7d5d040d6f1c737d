# Condenses Jaeger's /api/traces answer to one line per span and one per
# event (Jaeger calls span events "logs"), for the scenario named by
# --arg scenario NAME (its root span is tracing-example/NAME). Tags and log
# fields are turned from Jaeger's [{key, type, value}] lists into
# {key: value} objects; otel.scope.name is left out. Use:
#   curl -s 'http://127.0.0.1:16686/api/traces?service=stormguard-example&limit=20' |
#     jq -c --arg scenario retried-twice -f examples/tracing/jaeger-excerpt.jq
.data[]
| select(any(.spans[]; .operationName == "tracing-example/" + $scenario))
| .spans | sort_by(.startTime)[]
| {spanID, operationName,
   parent: ([.references[] | select(.refType == "CHILD_OF") | .spanID][0]),
   startTime, duration,
   tags: (.tags | map(select(.key != "otel.scope.name") | {(.key): .value}) | add)},
  (.logs[] | {log: .timestamp, fields: (.fields | map({(.key): .value}) | add)})
