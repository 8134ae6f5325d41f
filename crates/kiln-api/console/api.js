// Kiln's API reference page: Swagger UI (npm's swagger-ui-dist, embedded in
// the binary, no CDN) reading this server's /openapi.json. The page's CSP is
// the console's: scripts, styles and requests from this origin only.
"use strict";

// what the CSP refused, for the browser test and anyone reading the console
window.kilnApiDoc = { violations: [] };
document.addEventListener("securitypolicyviolation", (e) => {
  window.kilnApiDoc.violations.push(`${e.violatedDirective} ${e.blockedURI}`);
});

if (window.SwaggerUIBundle) {
  window.kilnApiDoc.ui = window.SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger",
    deepLinking: true,
    // no call to a validator service elsewhere
    validatorUrl: null,
  });
} else {
  document.getElementById("api-missing").hidden = false;
}
