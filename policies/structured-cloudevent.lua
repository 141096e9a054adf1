-- structured-cloudevent: delivers the event in CloudEvents structured mode.
--
-- For consumers that read one JSON document instead of ce-* headers: the
-- attributes and the data travel together in an application/cloudevents+json
-- body (the ce-* headers are still sent, describing the same event).  A JSON
-- payload is embedded as "data"; any other payload travels as a string in
-- "data" (fine for text; binary payloads would need data_base64).
return {
  shape = function(ev)
    local ce = {
      specversion = "1.0",
      id = ev.id,
      source = ev.source,
      type = ev.type,
      time = ev.time,
      subject = ev.subject,
      datacontenttype = ev.content_type,
      tenantid = ev.tenant,
      schemaversion = ev.schema_version,
    }
    for name, value in pairs(ev.extensions) do
      if ce[name] == nil then
        ce[name] = value
      end
    end
    if ev.data ~= nil then
      ce.data = ev.data
    else
      ce.data = ev.body
    end
    return ce, { ["Content-Type"] = "application/cloudevents+json" }
  end,
}
