-- Argo CD health for fibers.dev resources: Connect, ConnectCluster, Transform, DatabusConsumer, Schema,
-- SchemaRegistry and Replay. All of them report kstatus conditions (Ready, Reconciling, Stalled) and observedGeneration,
-- so one script serves them. Argo CD runs it in Lua 5.1 (gopher-lua) with the object in `obj`.

-- Ready=True with one of these reasons means "stopped on purpose".
local SUSPENDED = { Suspended = true, Paused = true, Stopped = true }

-- Ready=False with one of these reasons will not clear by waiting: the spec, a Secret or the
-- connector needs attention. (Stalled=True is Degraded whatever the reason.)
local FAILED = {
  InvalidSpec = true, SecretNotFound = true, InvalidConfig = true,
  ClusterNotAllowed = true, AmbiguousDefaultCluster = true,
  ConnectRejected = true, ConnectorNotOwned = true, ConsumerGroupInUse = true, ConnectorFailed = true,
  TasksFailed = true,
  AutoRestartExhausted = true,
  RunFailed = true, SubmissionDeadlineExceeded = true, StreamEnded = true,
  CheckpointInvalid = true, ConsumerFailing = true,
  SubjectExists = true, SubjectOwned = true, Incompatible = true, InvalidSchema = true, Drifted = true,
  ReplayFailed = true, ReplayConflict = true, NothingToReplay = true, StartBeforeRetention = true,
}

local function result(status, message)
  return { status = status, message = message }
end

local function condition(conditions, kind)
  for _, c in ipairs(conditions or {}) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

-- No deletion branch: Argo CD reports "Pending deletion" itself for anything being deleted, and
-- never runs a health check on it.
local meta = obj.metadata or {}

local status = obj.status
if status == nil then
  return result("Progressing", "Waiting for the operator to report a status")
end
if meta.generation ~= nil and status.observedGeneration ~= meta.generation then
  return result("Progressing", "Waiting for the operator to observe generation " .. tostring(meta.generation))
end

local ready = condition(status.conditions, "Ready")
local stalled = condition(status.conditions, "Stalled")
local message = (ready and ready.message) or ""

if ready ~= nil and ready.status == "True" then
  if SUSPENDED[ready.reason] then
    return result("Suspended", message)
  end
  return result("Healthy", message)
end

-- A batch Transform whose last run finished is done, not waiting for anything.
local spec = obj.spec or {}
if obj.kind == "Transform" and spec.mode ~= "streaming" and status.phase == "Succeeded" then
  return result("Healthy", message)
end

if stalled ~= nil and stalled.status == "True" then
  if message == "" then
    message = stalled.message or ""
  end
  return result("Degraded", message)
end
if ready ~= nil and ready.status == "False" and FAILED[ready.reason] then
  return result("Degraded", message)
end

if message == "" then
  message = "the Ready condition"
end
return result("Progressing", "Waiting for " .. message)
