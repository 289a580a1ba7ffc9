package httpapi

import (
	"embed"
	"io/fs"
	"net/http"
)

// consoleFiles are the web console's static files: one page, one script, one stylesheet, plain
// JavaScript on the management API, so nothing needs building.
//
//go:embed console
var consoleFiles embed.FS

// consoleFS is the console directory itself.
func consoleFS() fs.FS {
	sub, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err) // the directory is embedded at build time
	}
	return sub
}

// serveConsole serves the web console: index.html at / and the assets under /console/. The page
// logs in with the management API's Basic authentication, so the files themselves are public.
func serveConsole(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name := ""
	switch {
	case r.URL.Path == "/" || r.URL.Path == "/index.html":
		name = "index.html"
	case len(r.URL.Path) > len("/console/") && r.URL.Path[:len("/console/")] == "/console/":
		name = r.URL.Path[len("/console/"):]
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:")
	http.ServeFileFS(w, r, consoleFS(), name)
}
