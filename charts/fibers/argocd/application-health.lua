-- Argo CD health for an Application inside an app of apps: its own health as Argo CD computed it.
-- Argo CD stopped assessing child Applications in 1.8; without this a parent syncs the next wave
-- while a child (the Fibers operator, say) is still Progressing.
local hs = { status = "Progressing", message = "" }
if obj.status ~= nil and obj.status.health ~= nil then
  hs.status = obj.status.health.status
  hs.message = obj.status.health.message or ""
end
return hs
